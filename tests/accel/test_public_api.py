from __future__ import annotations

import inspect

import accel
import accel.testing


def _public_names(module: object) -> list[str]:
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and name not in {"annotations", "TYPE_CHECKING"}
    )


def test_all_matches_public_names() -> None:
    assert accel.__all__ == _public_names(accel)


def test_all_is_sorted() -> None:
    assert accel.__all__ == sorted(accel.__all__)
    assert accel.testing.__all__ == sorted(accel.testing.__all__)


def test_testing_all_matches_public_names() -> None:
    assert accel.testing.__all__ == _public_names(accel.testing)


def test_every_public_name_has_a_docstring() -> None:
    undocumented = [name for name in accel.__all__ if not inspect.getdoc(getattr(accel, name))]
    assert undocumented == []


def test_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    assert accel.__version__ == version("accel-hal")


def test_unknown_attribute_raises() -> None:
    try:
        accel.does_not_exist  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "does_not_exist" in str(exc)
    else:
        raise AssertionError("expected AttributeError")

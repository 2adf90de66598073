"""inductor's TF32 advice is ignored, exactly, wherever pytest turns warnings into errors.

On a GPU of compute capability 8.0 or more, compiling an fp32 matmul warns "TensorFloat32
tensor cores ... available but not enabled"; raised as an error inside compilation it
fails the CUDA compile checks with BackendCompilerFailed. No GPU is needed to check the
filter: the warning is raised here by hand.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

from accel import _cli

MESSAGE = (
    "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. "
    "Consider setting `torch.set_float32_matmul_precision('high')` for better performance."
)


def test_project_configuration_ignores_the_advice() -> None:
    # This project's pytest configuration makes every other warning an error.
    warnings.warn(MESSAGE, UserWarning, stacklevel=1)
    with pytest.raises(UserWarning, match="another"):
        warnings.warn("another warning", UserWarning, stacklevel=1)


def test_filter_matches_inductor_wording() -> None:
    spec = importlib.util.find_spec("torch._inductor.compile_fx")
    if spec is None or spec.origin is None:
        pytest.skip("this torch has no inductor")
    source = Path(spec.origin).read_text(encoding="utf-8")
    if "_warn_tf32_disabled" not in source:
        pytest.skip("this torch's inductor gives no TF32 advice")
    prefix = _cli.TF32_ADVICE_FILTER.split(":")[1]
    assert prefix in source, "inductor's wording changed"


def test_conformance_runner_passes_the_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(pytest, "main", lambda args: seen.append(list(args)) or 0)
    assert _cli._run_conformance("cpu", ["-q"]) == 0
    arguments = seen[0]
    assert arguments[arguments.index("-W") + 1] == _cli.TF32_ADVICE_FILTER

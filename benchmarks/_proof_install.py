"""The GPU proof's environment: a throwaway venv on top of this one, installed with no index.

The machine the proof runs on has no network, so nothing here may reach a package index:

* the venv is layered on the running interpreter's environment with ``site.addsitedir``
  lines in a ``.pth`` file (``--system-site-packages`` would expose the *base*
  interpreter's packages, and the GPU image's Python is itself a venv);
* accel is installed from a prebuilt wheel in the wheel directory when one is there,
  else ``pip install --no-deps --no-build-isolation --no-index -e .`` with the
  setuptools and wheel already installed, when they satisfy ``[build-system] requires``;
* fairscale 0.4.13 (a pure-Python wheel, built anywhere with ``pip wheel``) and numpy
  (``import fairscale`` needs it; torch does not bring it) come from the wheel directory;
  so does DeepSpeed, optionally, with its requirements.
"""

from __future__ import annotations

import importlib.metadata
import re
import site
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAIRSCALE_VERSION = "0.4.13"

#: What to bring for the fairscale comparison, and how to make it on a machine with network
#: (the target machine has CPython 3.12 on x86-64 Linux; fairscale is pure Python).
WHEELS_TO_BRING = (
    (
        f"fairscale-{FAIRSCALE_VERSION}-py3-none-any.whl",
        f"pip wheel --no-deps fairscale=={FAIRSCALE_VERSION} -w .whl",
        "always (PyPI has only its sdist)",
    ),
    (
        "numpy-<version>-cp312-cp312-manylinux_2_27_x86_64.whl (numpy>=1.22)",
        "pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
        "--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 numpy -d .whl",
        "only where `python3 -c 'import numpy'` fails there (the lent GPU image has numpy 2.5)",
    ),
    (
        "deepspeed-0.19.8-py3-none-any.whl and the wheels it requires",
        "python3.12 -m pip wheel deepspeed==0.19.8 -w .whl (on x86-64 Linux, beside torch)",
        "optional: bench_offload.py times DeepSpeed ZeRO-3 with CPU offload only where it "
        "installs (else its JSON says not installed)",
    ),
    (
        "accel_hal-<version>-py3-none-any.whl",
        "pip wheel --no-deps . -w .whl",
        "optional: installed first, it needs no setuptools there (else pip builds the "
        "working tree with the environment's setuptools, which must satisfy "
        "[build-system] requires)",
    ),
)


def layer_on_current(venv: Path) -> Path:
    """Write a ``.pth`` into ``venv`` that adds this interpreter's site directories.

    Returns:
        The venv's Python.
    """
    python = venv / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    purelib.mkdir(parents=True, exist_ok=True)
    directories = [*site.getsitepackages(), site.getusersitepackages()]
    lines = [f"import site; site.addsitedir({str(d)!r})" for d in dict.fromkeys(directories)]
    (purelib / "_accel_gpu_proof_outer.pth").write_text("\n".join(lines) + "\n")
    return python


def build_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The ``[build-system] requires`` list of ``pyproject`` (no TOML parser needed)."""
    text = pyproject.read_text(encoding="utf-8")
    section = re.search(r"^\[build-system\]\s*$(.*?)(?=^\[)", text, re.M | re.S)
    body = section.group(1) if section else ""
    found = re.search(r"requires\s*=\s*\[(.*?)\]", body, re.S)
    return re.findall(r"\"([^\"]+)\"", found.group(1)) if found else []


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def unmet_build_requirements(requirements: list[str]) -> list[str]:
    """The build requirements this environment does not satisfy (``>=`` or bare names)."""
    unmet = []
    for requirement in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:>=\s*([\w.]+))?\s*", requirement)
        if match is None:
            unmet.append(f"{requirement} (a requirement this check cannot read)")
            continue
        name, minimum = match.groups()
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        if minimum and _version_tuple(installed) < _version_tuple(minimum):
            unmet.append(f"{requirement} (installed: {installed})")
    return unmet


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install_commands(python: str, wheels: Path) -> tuple[list[list[str]], str]:
    """The pip commands to try in order, and the sentence to print when none can work."""
    pip = [python, "-m", "pip", "install", "--no-deps", "--no-index"]
    built = sorted(wheels.glob("accel_hal-*.whl")) if wheels.is_dir() else []
    commands: list[list[str]] = []
    if built:
        commands.append([*pip, str(built[-1])])
    unmet = unmet_build_requirements(build_requirements())
    # Tried with any setuptools: pip does not check the build requirements without
    # isolation, and setuptools 70.1 or later builds without the wheel package.
    if _installed("setuptools"):
        commands.append([*pip, "--no-build-isolation", "-e", "."])
    if wheels.is_dir() and any(wheels.glob("setuptools-*.whl")):
        commands.append([*pip, "--find-links", str(wheels), "-e", "."])
    needed = " ".join(f"'{r}'" for r in build_requirements()) or "setuptools"
    advice = (
        f"Nothing installed accel with no index here ({'; '.join(unmet) or 'pip failed'}): "
        f"bring a built wheel (pip wheel --no-deps . -w {wheels.name}) or the build "
        f"requirements as wheels (pip download {needed} -d {wheels.name}) in {wheels}/."
    )
    return commands, advice


def fairscale_wheels(wheels: Path) -> tuple[list[Path], list[str]]:
    """The wheels to install for fairscale from ``wheels``, and what is missing."""
    found = sorted(wheels.glob(f"fairscale-{FAIRSCALE_VERSION}*")) if wheels.is_dir() else []
    missing = [] if found else [WHEELS_TO_BRING[0][0]]
    chosen = found[-1:]
    try:
        importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        numpy = sorted(wheels.glob("numpy-*.whl")) if wheels.is_dir() else []
        chosen += numpy[-1:]
        if not numpy:
            missing.append(WHEELS_TO_BRING[1][0])
    return chosen, missing


def bring_advice(wheels: Path) -> list[str]:
    """Lines saying which wheels to bring into ``wheels`` and how to make them."""
    lines = [f'wheels to bring into {wheels}/ (git-ignored: carry it, e.g. carry: [".whl"]):']
    for name, command, when in WHEELS_TO_BRING:
        lines.append(f"  {name}: {when}; make it with: {command}")
    return lines

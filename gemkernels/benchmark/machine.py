"""The machine under a benchmark: what a result depends on besides the code, free memory, and the
ceilings (copy bandwidth, matrix-product rate) measured in the same run that the results are set against.

Everything here works without torch (numpy-only install: CPU ceilings from numpy); GPU facts come from
torch and, when it is installed, nvidia-ml-py (``pynvml``), which is imported only then.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from gemkernels.benchmark.timing import cpu_call, cuda_call, measure

#: The folder above the imported ``gemkernels`` package: the repository in a source checkout or an editable
#: install, site-packages (or wherever it was unpacked) otherwise.
CHECKOUT = Path(__file__).resolve().parents[2]


def git(*args: str, cwd: Path = CHECKOUT) -> str | None:
    """Output of a git command in ``cwd``, or None outside a repository or without git."""
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def package_commit(checkout: Path = CHECKOUT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the gemkernels that is imported, not of whatever repository holds site-packages.

    A source checkout (``checkout`` is the top of its git repository) gives HEAD and whether tracked files
    changed; an install from a git URL, the commit pip recorded (``direct_url.json``); anything else
    $GEMKERNELS_GIT_COMMIT (a copy of the tree without .git, e.g. on a lent GPU machine) or None, with dirty None
    (not known)."""
    top = git("rev-parse", "--show-toplevel", cwd=checkout)
    if top is not None and Path(top).resolve() == checkout.resolve():
        status = git("status", "--porcelain", "--untracked-files=no", cwd=checkout)
        return git("rev-parse", "HEAD", cwd=checkout), None if status is None else bool(status)
    try:
        recorded = json.loads(metadata.distribution("gemkernels").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        recorded = {}
    commit = (recorded.get("vcs_info") or {}).get("commit_id") if isinstance(recorded, dict) else None
    return commit or os.environ.get("GEMKERNELS_GIT_COMMIT"), None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(package: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def environment(device: str = "cpu") -> dict[str, Any]:
    """Versions, commit, machine and date. ``device`` "cuda" adds ``gpu`` (name) and ``gpu_info`` (`gpu_info`).

    The commit is the imported package's (`package_commit`); ``git_dirty`` is None when it cannot be told.
    """
    commit, dirty = package_commit()
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": dirty,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "host_memory_bytes": meminfo("MemTotal"),
        "python": platform.python_version(),
        "gemkernels": version("gemkernels"),
        "numpy": np.__version__,
        "torch": version("torch"),
        "triton": version("triton"),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
                       if k in os.environ},
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "gpu": None,
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if device == "cuda":
            env["gpu"] = torch.cuda.get_device_name()
            env["gpu_info"] = gpu_info()
    return env


def gpu_info() -> dict[str, Any]:
    """The current CUDA device from torch, plus nvidia-ml-py's view of it when ``pynvml`` is installed."""
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info: dict[str, Any] = {
        "name": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None),
        "cuda_runtime": torch.version.cuda,
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    info["nvml"] = nvml_info(index) if importlib.util.find_spec("pynvml") is not None else "pynvml not installed"
    return info


def nvml_info(index: int) -> dict[str, Any] | str:
    """Name, driver, memory, clocks (MHz) and power limits (W) of GPU ``index`` from NVML, or why not.

    ``index`` is torch's device index; it is NVML's too unless CUDA_VISIBLE_DEVICES reorders devices.
    """
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"nvmlInit failed: {err}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        queries = {
            "name": lambda: pynvml.nvmlDeviceGetName(handle),
            "driver": pynvml.nvmlSystemGetDriverVersion,
            "memory_total_bytes": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total,
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
            "enforced_power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        }
        info: dict[str, Any] = {}
        for key, query in queries.items():
            try:
                value = query()
                info[key] = value.decode() if isinstance(value, bytes) else value
            except pynvml.NVMLError as err:
                info[key] = f"error: {err}"
        return info
    except pynvml.NVMLError as err:
        return f"NVML query failed: {err}"
    finally:
        pynvml.nvmlShutdown()


def free_bytes(device: str) -> int:
    """Memory a benchmark may still allocate: free GPU memory on "cuda", MemAvailable on the host ("cpu")."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    available = meminfo("MemAvailable")
    if available is not None:
        return available
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def l2_bytes(device: str) -> int:
    """Last-level cache a GPU's repeated runs would hit (L2); 0 on the CPU, where inputs are not rotated."""
    if device != "cuda":
        return 0
    import torch

    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20))


@dataclass(frozen=True)
class Ceilings:
    """What the machine did in this run: copy bandwidth (bytes read + written per second) and the
    matrix-product rate (FLOP/s) per benchmark dtype name, with the sizes that measured them."""

    device: str
    copy_bytes_per_s: float
    matmul_flop_per_s: dict[str, float]
    copy_bytes: int
    matmul_n: int
    matmul_dtype: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Defaults per device: bytes copied, matrix side, repeats. The copy is far beyond the last-level cache.
CEILING_SIZES = {"cuda": (2 << 30, 8192, 10), "cpu": (256 << 20, 2048, 5)}


def copy_bandwidth(device: str, nbytes: int, repeats: int) -> float:
    """Bytes read + written per second of one ``nbytes`` copy, median of ``repeats``.

    "cuda": a device-to-device ``copy_``, timed by CUDA events; "cpu": ``np.copyto`` (memcpy), wall clock.
    """
    if device == "cuda":
        import torch

        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
        dst = torch.empty_like(src)
        t = measure(lambda: dst.copy_(src), repeats, timer=cuda_call)
        del src, dst
        torch.cuda.empty_cache()
    else:
        src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
        dst = np.empty_like(src)
        t = measure(lambda: np.copyto(dst, src), repeats, timer=cpu_call)
    return 2 * nbytes / t.median


def matmul_rate(device: str, dtype: str, n: int, repeats: int) -> float:
    """FLOP/s (2 n^3 per product) of an ``n x n`` random matrix product, median of ``repeats``.

    "cuda": torch.matmul in ``dtype`` (a torch dtype name; fp32 at torch's current TF32 setting);
    "cpu": numpy's BLAS in float32, whatever ``dtype`` (the CPU backends compute fp16/bf16 in float32).
    """
    if device == "cuda":
        import torch

        a, b = (torch.randn(n, n, device="cuda").to(getattr(torch, dtype)) for _ in range(2))
        t = measure(lambda: torch.matmul(a, b), repeats, timer=cuda_call)
        del a, b
        torch.cuda.empty_cache()
    else:
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        t = measure(lambda: a @ b, repeats, timer=cpu_call)
    return 2 * n ** 3 / t.median


def measure_ceilings(device: str, dtypes: dict[str, str], copy_bytes: int | None = None,
                     matmul_n: int | None = None, repeats: int | None = None) -> Ceilings:
    """Copy bandwidth and, for each ``{benchmark name: torch dtype name}``, the matrix-product rate.

    On the CPU every dtype shares one float32 GEMM measurement. Sizes default to `CEILING_SIZES`.
    """
    default_bytes, default_n, default_repeats = CEILING_SIZES[device]
    copy_bytes, matmul_n = copy_bytes or default_bytes, matmul_n or default_n
    repeats = repeats or default_repeats
    bandwidth = copy_bandwidth(device, copy_bytes, repeats)
    if device == "cuda":
        rates = {name: matmul_rate(device, torch_name, matmul_n, repeats) for name, torch_name in dtypes.items()}
        used = dict(dtypes)
    else:
        rate = matmul_rate(device, "float32", matmul_n, repeats)
        rates, used = dict.fromkeys(dtypes, rate), dict.fromkeys(dtypes, "float32")
    return Ceilings(device, bandwidth, rates, copy_bytes, matmul_n, used)

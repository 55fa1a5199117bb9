"""Benchmark rows and the CSV they are appended to, each row carrying the environment it was measured in."""

from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from flashtile.bench.grid import Config
from flashtile.bench.timing import Timing

COLUMNS = (
    "commit",
    "gpu",
    "driver",
    "torch",
    "triton",
    "cudnn",
    "date",
    "device",
    "impl",
    "mode",
    "dtype",
    "causal",
    "batch",
    "heads",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "p20_ms",
    "p50_ms",
    "p80_ms",
    "tflops",
    "gbytes_per_s",
    "status",
    "detail",
)
# The options preset's CSV adds what makes an option cell self-describing; the plain grid's CSV keeps COLUMNS.
OPTION_COLUMNS = (
    *COLUMNS[: COLUMNS.index("head_dim") + 1],
    "window_left",
    "window_right",
    "softcap",
    "alibi",
    "dropout_p",
    "sink",
    "layout",
    "lengths",
    "pairs",
    *COLUMNS[COLUMNS.index("head_dim") + 1 :],
)
# The head-dims preset's CSV adds V's head dim.
HEAD_DIM_COLUMNS = (
    *COLUMNS[: COLUMNS.index("head_dim") + 1],
    "head_dim_v",
    *COLUMNS[COLUMNS.index("head_dim") + 1 :],
)
STATUSES = ("ok", "wrong", "unsupported", "oom", "error", "skipped")
# Relative to the current directory, so results land in plain view wherever the command runs, and the results
# committed in a checkout (benchmarks/results/) change only when --out-dir names that folder.
DEFAULT_OUT_DIR = Path("flashtile-results")


@dataclass(frozen=True)
class Environment:
    """What a row was measured on; ``date`` is the run's start (UTC), shared by all its rows."""

    commit: str
    gpu: str
    driver: str
    torch: str
    triton: str
    cudnn: str
    date: str
    device: str


@dataclass(frozen=True)
class Result:
    """One (configuration, implementation) outcome; ``timing`` only when ``status`` is "ok"."""

    config: Config
    impl: str
    status: str
    detail: str = ""
    timing: Timing | None = None
    error: float | None = None

    @property
    def tflops(self) -> float | None:
        return self.config.flops() / (self.timing.p50_ms * 1e9) if self.timing else None

    @property
    def gbytes_per_s(self) -> float | None:
        return self.config.bytes_moved() / (self.timing.p50_ms * 1e6) if self.timing else None

    @classmethod
    def from_row(cls, row: dict[str, str]) -> Result:
        """The result a CSV row records; ``error`` is read back from a "wrong" row's detail. A row of a CSV
        without the option columns is a plain cell; one without ``head_dim_v`` has V's head dim equal to
        Q/K's. A float8 cell's dtype reads "fp8" (its output is bf16)."""
        config = Config(
            device=row["device"],
            dtype="bf16" if row["dtype"] == "fp8" else row["dtype"],
            mode=row["mode"],
            causal=row["causal"] == "true",
            **{
                name: int(row[name])
                for name in ("batch", "heads", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")
            },
            head_dim_v=int(row.get("head_dim_v") or 0),
            window=(int(row.get("window_left") or -1), int(row.get("window_right") or -1)),
            softcap=float(row.get("softcap") or 0.0),
            alibi=row.get("alibi") == "true",
            dropout_p=float(row.get("dropout_p") or 0.0),
            sink=row.get("sink") == "true",
            layout=row.get("layout") or "dense",
            lengths=tuple(int(n) for n in (row.get("lengths") or "").split()),
            fp8=row["dtype"] == "fp8",
        )
        timing = None
        if row["p50_ms"]:
            timing = Timing(float(row["p20_ms"]), float(row["p50_ms"]), float(row["p80_ms"]), reps=0)
        found = (
            re.search(r"max\|err\| ([-+0-9.eE]+|inf|nan)", row["detail"])
            if row["status"] == "wrong"
            else None
        )
        return cls(
            config, row["impl"], row["status"], row["detail"], timing, float(found[1]) if found else None
        )

    def row(self, env: Environment) -> dict[str, str]:
        """Every column any results CSV has; ``append_rows`` keeps those of the file written."""
        c, t = self.config, self.timing
        return {
            **{
                name: getattr(env, name)
                for name in ("commit", "gpu", "driver", "torch", "triton", "cudnn", "date")
            },
            "device": c.device,
            "impl": self.impl,
            "mode": c.mode,
            "dtype": "fp8" if c.fp8 else c.dtype,
            "causal": "true" if c.causal else "false",
            "batch": str(c.batch),
            "heads": str(c.heads),
            "heads_kv": str(c.heads_kv),
            "seqlen_q": str(c.seqlen_q),
            "seqlen_k": str(c.seqlen_k),
            "head_dim": str(c.head_dim),
            "head_dim_v": str(c.dim_v),
            "window_left": str(c.window[0]),
            "window_right": str(c.window[1]),
            "softcap": f"{c.softcap:g}",
            "alibi": "true" if c.alibi else "false",
            "dropout_p": f"{c.dropout_p:g}",
            "sink": "true" if c.sink else "false",
            "layout": c.layout,
            "lengths": " ".join(str(n) for n in c.lengths),
            "pairs": str(c.heads * c.pairs()),
            "p20_ms": f"{t.p20_ms:.6g}" if t else "",
            "p50_ms": f"{t.p50_ms:.6g}" if t else "",
            "p80_ms": f"{t.p80_ms:.6g}" if t else "",
            "tflops": f"{self.tflops:.6g}" if t else "",
            "gbytes_per_s": f"{self.gbytes_per_s:.6g}" if t else "",
            "status": self.status,
            "detail": self.detail,
        }


def _git(*args: str) -> str | None:
    here = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit() -> str:
    """The checked-out commit of the measured code, with "+dirty" when tracked files differ from it.

    ``FLASHTILE_COMMIT`` names it where the code runs from a copy without its git history (a GPU box).
    """
    if os.environ.get("FLASHTILE_COMMIT"):
        return os.environ["FLASHTILE_COMMIT"]
    head = _git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown"
    return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else ""


def _cudnn() -> str:
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if not version:
        return ""
    # cuDNN 9 encodes major·10000 + minor·100 + patch; cuDNN 8 encoded major·1000 + minor·100 + patch.
    major, rest = divmod(version, 10000 if version >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def environment(device: torch.device) -> Environment:
    """Commit, device name, driver, library versions and the current UTC time."""
    on_gpu = device.type == "cuda"
    return Environment(
        commit=_commit(),
        gpu=torch.cuda.get_device_name(device) if on_gpu else f"CPU: {_cpu_name()}",
        driver=_driver() if on_gpu else "",
        torch=torch.__version__,
        triton=_package_version("triton"),
        cudnn=_cudnn() if on_gpu else "",
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=device.type,
    )


def device_of(name: str, flag: str = "--device") -> torch.device:
    """The device a ``--device`` flag names ("auto": CUDA when present); ValueError for a name torch does not
    parse, a kind other than cpu or cuda, or a CUDA device this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{flag} {name}: choose auto, cpu, cuda or cuda:N")
    count = torch.cuda.device_count() if device.type == "cuda" and torch.cuda.is_available() else 0
    if device.type == "cuda" and count == 0:
        raise ValueError(f"{flag} {name}: torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise ValueError(f"{flag} {name}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def environment_of(row: dict[str, str]) -> Environment:
    """The environment a CSV row was measured in."""
    return Environment(**{name: row[name] for name in Environment.__dataclass_fields__})


def add_output_arguments(parser: argparse.ArgumentParser, name: str, name_note: str = "") -> None:
    """``--out-dir`` and ``--name``: where a command's CSV (``DIR/NAME.csv``) and plots go; ``name_note``
    qualifies the default name in the help."""
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        metavar="DIR",
        help=f"folder for the CSV (appended to) and the plots (default: ./{DEFAULT_OUT_DIR} in the current "
        "directory, so that a run never touches a checkout's committed results; those were written with "
        "--out-dir benchmarks/results)",
    )
    parser.add_argument(
        "--name",
        default=name,
        help=f"file name stem: DIR/NAME.csv and DIR/NAME*.png (default {name}{name_note})",
    )


def output_csv(args: argparse.Namespace) -> Path:
    """The CSV that ``add_output_arguments``' flags name."""
    return args.out_dir / f"{args.name}.csv"


def _check_header(path: Path, columns: Sequence[str]) -> None:
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    if header != list(columns):
        raise ValueError(
            f"{path} has columns {header}, not the {len(columns)} this version writes "
            f"({', '.join(columns)}): pass another --out-dir or --name"
        )


def check_output(path: Path, columns: Sequence[str] = COLUMNS) -> None:
    """Raise ValueError where ``append_rows`` could not write ``path``: a folder on the way that is a file or
    cannot be written, a folder at the CSV's own path, or a CSV with other columns. Commands call it before
    measuring, so that a bad ``--out-dir`` costs no run."""
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a results CSV: pass another --name")
    # The nearest folder that exists: append_rows creates the rest.
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"cannot write {path}: {folder} is a file, not a folder (--out-dir)")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"cannot write {path}: {path if path.exists() else folder} is not writable")
    if path.exists() and path.stat().st_size:
        _check_header(path, columns)


def append_rows(path: Path, rows: Iterable[Mapping[str, object]], columns: Sequence[str] = COLUMNS) -> None:
    """Append rows to the CSV at ``path``, writing the header first when the file is new or empty; a file
    with other columns is refused."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = not path.exists() or path.stat().st_size == 0
    if not fresh:
        _check_header(path, columns)
    with path.open("a", newline="") as f:
        # A plain run's rows also carry the option fields, which its CSV leaves out.
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        if fresh:
            writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path, columns: Sequence[str] = ()) -> list[dict[str, str]]:
    """Every row of a results CSV as a dict keyed by column name; ValueError where the file has rows but
    lacks one of ``columns`` (another command's CSV, or not a results CSV at all)."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        # Read inside the block: an empty file's DictReader reads its header again on this access.
        header = reader.fieldnames or ()
    missing = [name for name in columns if name not in header]
    if rows and missing:
        named = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(f"{path} is not a results CSV of this command: it lacks the columns {named}")
    return rows


def latest_run(path: Path, columns: Sequence[str]) -> tuple[list[dict[str, str]], str]:
    """The rows of the CSV's latest run (its newest ``date``) and that date, for ``--plot-only``;
    ValueError where the file is missing, holds no rows or is another command's CSV."""
    rows = read_rows(path, columns) if path.exists() else []
    if not rows:
        raise ValueError(f"no results in {path}")
    date = max(row["date"] for row in rows)
    return [row for row in rows if row["date"] == date], date

"""The library runs without the command line's packages; the command line names the extra that brings them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flashtile

SRC = Path(flashtile.__file__).resolve().parents[1]
PYPROJECT = SRC.parent / "pyproject.toml"

# A meta-path finder that makes `import rich` and `import matplotlib` fail as if they were not installed.
BLOCK_CLI_EXTRA = textwrap.dedent(
    """
    import sys

    class BlockCliExtra:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("rich", "matplotlib"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, BlockCliExtra())
    """
)


def _run_without_cli_extra(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", BLOCK_CLI_EXTRA + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_and_attention_need_neither_rich_nor_matplotlib() -> None:
    done = _run_without_cli_extra(
        """
        import torch
        import flashtile
        from flashtile import FlashAttention, flash_attn_func

        q, k, v = (torch.randn(1, 16, 2, 16, requires_grad=True) for _ in range(3))
        out = flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
        assert out.shape == (1, 16, 2, 16) and torch.isfinite(q.grad).all()
        assert not {"rich", "matplotlib"} & set(sys.modules), sorted(sys.modules)
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("command", ["check", "bench", "roofline", "memory"])
def test_the_command_line_without_its_extra_names_the_extra(command: str) -> None:
    done = _run_without_cli_extra(
        f"""
        from flashtile.cli import main

        raise SystemExit(main([{command!r}, "--help"]))
        """
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'flashtile[cli]'" in done.stderr
    assert "Traceback" not in done.stderr


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\[\]-]+", requirement).group()


def test_declared_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert {_name(dep) for dep in project["dependencies"]} == {"torch", "triton", "numpy"}
    # PyTorch's PyPI builds before 2.10 pin a Triton older than the 3.6 the kernels are written for.
    assert "torch>=2.10" in project["dependencies"]
    extras = project["optional-dependencies"]
    assert {_name(dep) for dep in extras["cli"]} == {"rich", "matplotlib"}
    assert {_name(dep) for dep in extras["transformers"]} == {"transformers"}
    # docs/testing.md runs the GPU suite with `-n 8`; the transformers tests need the integration's extra.
    assert "flashtile[cli,transformers]" in extras["dev"]
    assert any(d.startswith("pytest-xdist") for d in extras["dev"])

"""Converters import without torch; TensorConverter says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_converters_import_without_torch_and_tensor_converter_names_the_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # importing torch now fails, as if not installed
        import expstore.converters, expstore.samplers
        from expstore import MissingDependencyError
        from expstore.converters import NumpyConverter, TensorConverter
        NumpyConverter({"s": "step"})
        try:
            TensorConverter({"s": "step"})
        except MissingDependencyError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "TensorConverter needs the optional dependency 'torch'" in out
    assert "pip install 'expstore[torch]'" in out


def test_importing_converters_and_samplers_does_not_import_torch() -> None:
    script = "import sys, expstore.converters, expstore.samplers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

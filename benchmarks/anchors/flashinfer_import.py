"""Imports FlashInfer for the anchors: the whole package when it imports, else only the modules
the anchors use.

`import flashinfer` runs the package's __init__, which imports every FlashInfer subsystem and,
through them, optional dependencies (CuTe DSL, cuDNN frontend, NCCL bindings, cuda-tile) that the
GPU machine may lack or hold in other versions; the decode wrapper and top_k need none of them.
When the full import fails, load_flashinfer() registers an empty package object for `flashinfer`
(its __path__ the installed package's folder, its __init__ not run) and imports
flashinfer.decode and flashinfer.topk from it, so only their own imports must resolve.
"""
import importlib
import importlib.util
import sys
import types


def _drop_flashinfer_modules():
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        del sys.modules[name]


def load_flashinfer():
    """(namespace with BatchDecodeWithPagedKVCacheWrapper, top_k, version, import_mode, and
    full_import_error when the lean path was taken) or raises ImportError with both reasons."""
    try:
        import flashinfer
        return types.SimpleNamespace(
            BatchDecodeWithPagedKVCacheWrapper=flashinfer.BatchDecodeWithPagedKVCacheWrapper,
            top_k=flashinfer.top_k, version=getattr(flashinfer, "__version__", "unknown"),
            import_mode="full", full_import_error=None, path=flashinfer.__file__)
    except Exception as e:  # ImportError, or an optional dependency of another version
        full_error = f"{type(e).__name__}: {e}"
    _drop_flashinfer_modules()
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"flashinfer is not installed (full import: {full_error})")
    package = types.ModuleType("flashinfer")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__spec__ = spec
    package.__package__ = "flashinfer"
    sys.modules["flashinfer"] = package
    try:
        version = importlib.import_module("flashinfer.version").__version__
        decode = importlib.import_module("flashinfer.decode")
        topk = importlib.import_module("flashinfer.topk")
    except Exception as e:
        _drop_flashinfer_modules()
        raise ImportError(f"full import: {full_error}; lean import of flashinfer.decode and "
                          f"flashinfer.topk: {type(e).__name__}: {e}") from e
    return types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=decode.BatchDecodeWithPagedKVCacheWrapper,
        top_k=topk.top_k, version=version, import_mode="lean (decode, topk)",
        full_import_error=full_error, path=spec.origin)

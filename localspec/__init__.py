"""localspec: speculative decoding on llama.cpp, for laptops and desktops."""

import importlib.util

__version__ = "0.1.0"

# llama.cpp's libraries load before numpy's: with numpy imported first, a CUDA build crashed while loading
# any model (docs/MODELS.md, "CUDA")
if importlib.util.find_spec("llama_cpp") is not None:
    try:
        import llama_cpp.llama_cpp  # noqa: F401
    except Exception:  # reported, in one line, where a model is first loaded (backend.model.llama)
        pass

"""autodice: split a CNN across edge devices, generate the distributed program, search mappings.

The stages, each a sub-package: :mod:`autodice.frontend` (model + mapping + platform -> plan and
sub-models), :mod:`autodice.backend` (plan -> ncnn models, one SPMD program, a package per host;
build; run under mpirun), :mod:`autodice.deploy` (packages -> boards over ssh), and
:mod:`autodice.dse` (profile, cost model, NSGA-II search), over :mod:`autodice.core` (the plan,
the specs, the model, errors). :mod:`autodice.api` is the library the CLI is a thin layer over;
its functions are here too, imported on first use so that ``import autodice`` stays cheap::

    import autodice
    front = autodice.search("model.onnx", "platform.txt", "profile.json", max_memory="1GB")
"""

from __future__ import annotations

from importlib import import_module

# (``autodice.api.deploy`` is not repeated here: ``autodice.deploy`` is the stage's package.)
__all__ = ["AutodiceError", "FrameError", "ImageRecipe", "SessionError", "build", "check", "gen",
           "open", "plan", "platform", "predict", "profile", "read_labels", "report", "run",
           "search", "split", "top_k"]
# Where the names that are not api.py's live: images into frames, scores into classes.
_ELSEWHERE = {"FrameError": ".backend.session", "SessionError": ".backend.session",
              "ImageRecipe": ".backend.session.frames", "read_labels": ".backend.session.results",
              "top_k": ".backend.session.results"}


def __getattr__(name: str):
    if name == "AutodiceError":
        from .core.errors import AutodiceError

        return AutodiceError
    if name in _ELSEWHERE:
        return getattr(import_module(_ELSEWHERE[name], __name__), name)
    if name in __all__:
        return getattr(import_module(".api", __name__), name)
    raise AttributeError(f"module 'autodice' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

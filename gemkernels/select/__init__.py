"""The selection library (DESIGN.md §1): `api` (``select``, ``select_batch``, ``select_ragged``, ``warm_up``),
`ragged` (the packed batch), `result`, `arrays` and `backends`.

The package is also callable: ``gemkernels.select(x, ...)`` is `gemkernels.select.api.select`, so ``gk.select``
is at once the function users call and the package its modules live in (``import gemkernels.select.api as api``
and ``monkeypatch.setattr("gemkernels.select.api....")`` keep working).
"""

import inspect
import sys
import types


class SelectPackage(types.ModuleType):
    """``gemkernels.select``: the package, callable as `gemkernels.select.api.select`."""

    def __call__(self, *args, **kwargs):
        return self.api.select(*args, **kwargs)


sys.modules[__name__].__class__ = SelectPackage

from gemkernels.select import api  # noqa: E402  (after the class swap: api is imported as a submodule of it)

__signature__ = inspect.signature(api.select)

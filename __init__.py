"""Not the package: the root folder of a t2mlr_jax clone (the package is `t2mlr_jax/` in it).

A script saved beside a clone whose folder is named `t2mlr_jax` runs with the clone's
parent first on sys.path, so `import t2mlr_jax` finds this folder before the installed
package; without this file Python imports it as an empty namespace package and fails
later with "cannot import name ... (unknown location)". Imported under that name, this
file says what happened and loads the package inside the clone in its place (pytest, too,
imports this folder, as the package of the rootdir; under another name it does nothing).
"""

if __name__ == "t2mlr_jax":
  import os as _os
  import warnings as _warnings

  _ROOT = _os.path.dirname(_os.path.abspath(__file__))
  _INNER = _os.path.join(_ROOT, "t2mlr_jax")
  _warnings.warn(
      f"'import t2mlr_jax' found {_ROOT}, the folder of a t2mlr_jax clone, not the package "
      f"inside it (the script's directory, {_os.path.dirname(_ROOT)}, comes first on "
      f"sys.path): loading the clone's package {_INNER} instead of any installed one. Run "
      "the script from another directory to use the installed package.", stacklevel=2)
  __path__ = [_INNER]
  if __spec__ is not None:
    __spec__.submodule_search_locations = [_INNER]
  __file__ = _os.path.join(_INNER, "__init__.py")
  with open(__file__) as _f:
    exec(compile(_f.read(), __file__, "exec"))

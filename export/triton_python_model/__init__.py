"""The Triton Python-backend model (model.py, with routerkt_held_states.py and routerkt_version_setup.py), shipped
as files: never imported by the project.

`PYTHON_MODEL_FILES` are what `routerkt export` copies verbatim into each python-backend version folder
(name -> path); model.py itself only runs inside Triton's Python stub, which puts the version folder on
sys.path, so model.py imports the other two beside it.
"""
from pathlib import Path

MODEL_PY = Path(__file__).with_name("model.py")
HELD_STATES_PY = Path(__file__).with_name("routerkt_held_states.py")
VERSION_SETUP_PY = Path(__file__).with_name("routerkt_version_setup.py")
PYTHON_MODEL_FILES = {"model.py": MODEL_PY, "routerkt_held_states.py": HELD_STATES_PY,
                      "routerkt_version_setup.py": VERSION_SETUP_PY}

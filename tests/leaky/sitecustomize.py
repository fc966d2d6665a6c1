"""A careless library that prints credentials, for the canary tests (Python imports `sitecustomize` at start-up
from PYTHONPATH). Once the variable named by LEAK_WHEN is set (a rank's environment), it prints the values of the
variables named in LEAK_VARIABLES the ways code prints them: a dict repr, JSON (escaped and not), URL-encoded and
shell-quoted. Nothing here holds a value: the tests set the variables."""

import json
import os
import shlex
import urllib.parse

if os.environ.get(os.environ.get("LEAK_WHEN", ""), ""):
    leaked = {name: os.environ[name] for name in os.environ.get("LEAK_VARIABLES", "").split() if name in os.environ}
    print(leaked)
    print(json.dumps(leaked))
    print(json.dumps(leaked, ensure_ascii=False))
    print(urllib.parse.urlencode(leaked))
    print(" ".join(shlex.quote(value) for value in leaked.values()), flush=True)

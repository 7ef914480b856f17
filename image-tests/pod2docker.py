#!/usr/bin/env python3
"""Turn one container of a static pod manifest into `docker run` arguments.

There is no kubelet here, so the image e2e runs each example manifest's
container the way the kubelet would: the same command and args (with
Kubernetes' $(VAR) expansion), the same env, the same hostPath volumes (under
a test root instead of /), and the same runAsUser/runAsGroup.

    pod2docker.py MANIFEST --container NAME --image IMAGE --root DIR

prints, NUL-separated, the arguments that follow `docker run [test options]`:
    -e K=V ... -v DIR/<hostPath>:<mountPath>[:ro] ... [--user U[:G]]
    [--entrypoint COMMAND0] IMAGE COMMAND1... ARGS...
and creates the hostPath dirs and files the volumes' types ask for
(DirectoryOrCreate / FileOrCreate), as the kubelet does. The pod's network
(hostNetwork) is left to the caller.

The manifest may be JSON (as GCE's are) or YAML (needs PyYAML; exit code 3
when it is missing). Only the fields these examples use are understood;
anything that would change how the container runs and is not understood
(valueFrom, envFrom, subPath, non-hostPath volumes) is refused (exit 2).
"""

import argparse
import json
import os
import re
import sys


def fail(msg, code=2):
    print(f"pod2docker: {msg}", file=sys.stderr)
    sys.exit(code)


def load(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml  # noqa: PLC0415 (only YAML manifests need it)
    except ImportError:
        fail(f"{path} is YAML and PyYAML is not installed (apt-get install python3-yaml)", 3)
    return yaml.safe_load(text)


def expand(text, env):
    """Kubernetes' $(VAR) expansion in command and args: $(VAR) of a
    defined variable is replaced, $$ is a literal $, anything else stays."""

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--container", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--root", required=True, help="hostPath P becomes ROOT/P")
    opts = ap.parse_args()

    pod = load(opts.manifest)
    if pod.get("kind") != "Pod":
        fail(f"{opts.manifest}: kind is {pod.get('kind')!r}, not Pod")
    spec = pod["spec"]
    matches = [c for c in spec["containers"] if c["name"] == opts.container]
    if len(matches) != 1:
        fail(f"{opts.manifest}: no single container named {opts.container!r}")
    ctr = matches[0]
    for key in ("envFrom", "workingDir"):
        if key in ctr:
            fail(f"{opts.manifest}: {key} is not supported here")

    out = []
    env = {}
    for item in ctr.get("env", []):
        if "valueFrom" in item:
            fail(f"{opts.manifest}: env {item['name']} uses valueFrom, not supported here")
        value = expand(str(item.get("value", "")), env)
        env[item["name"]] = value
        out += ["-e", f"{item['name']}={value}"]

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    root = os.path.abspath(opts.root)
    for mount in ctr.get("volumeMounts", []):
        if "subPath" in mount:
            fail(f"{opts.manifest}: subPath is not supported here")
        vol = volumes.get(mount["name"])
        if vol is None or "hostPath" not in vol:
            fail(f"{opts.manifest}: volume {mount['name']!r} is not a hostPath volume")
        host = root + "/" + vol["hostPath"]["path"].lstrip("/")
        kind = vol["hostPath"].get("type", "")
        if kind == "FileOrCreate":
            os.makedirs(os.path.dirname(host), exist_ok=True)
            if not os.path.exists(host):
                open(host, "a", encoding="utf-8").close()
        elif kind in ("DirectoryOrCreate", ""):
            # "" (no check) on a missing path: the kubelet makes a directory.
            os.makedirs(host, exist_ok=True)
        elif not os.path.exists(host):
            fail(f"{opts.manifest}: hostPath {vol['hostPath']['path']} ({kind}) must exist")
        spec_v = f"{host}:{mount['mountPath']}"
        if mount.get("readOnly"):
            spec_v += ":ro"
        out += ["-v", spec_v]

    sc = {**spec.get("securityContext", {}), **ctr.get("securityContext", {})}
    if "runAsUser" in sc:
        user = str(sc["runAsUser"])
        if "runAsGroup" in sc:
            user += f":{sc['runAsGroup']}"
        out += ["--user", user]

    command = [expand(str(a), env) for a in ctr.get("command", [])]
    args = [expand(str(a), env) for a in ctr.get("args", [])]
    if command:
        out += ["--entrypoint", command[0], opts.image] + command[1:] + args
    else:
        out += [opts.image] + args
    sys.stdout.write("\0".join(out) + "\0")


if __name__ == "__main__":
    main()

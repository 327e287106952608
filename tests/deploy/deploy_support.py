"""What the deploy tests share: reading the files under deploy/, walking Kubernetes objects, validating them
against schemas, and finding every `posbias` command the deployment files run."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kuberay_schema import SCHEMAS as KUBERAY_SCHEMAS
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERAY = DEPLOY / "kuberay"
DOCKER = DEPLOY / "docker"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile.*") if p.suffix != ".dockerignore")
SCRIPTS = sorted(DOCKER.glob("*.sh"))

# The oldest Kubernetes these manifests promise to work on, and the newest schemas kubernetes-validate has.
K8S_VERSIONS = ("1.30.0", "1.37.0")


def load_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in `path`."""
    with path.open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def kube_objects() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under deploy/kuberay (the kustomization itself is not one)."""
    return [
        (path, doc)
        for path in sorted(KUBERAY.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_docs(path)
    ]


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (named `name`, when given) under deploy/kuberay."""
    found = [
        doc
        for _, doc in kube_objects()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def validate_core(obj: dict[str, Any], version: str) -> None:
    """Validate a built-in Kubernetes object against the strict schema of `version` (unknown fields fail)."""
    kubernetes_validate.validate(obj, version, strict=True)


@cache
def _k8s_definitions(version: str) -> dict[str, Any]:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"
    loaded: dict[str, Any] = json.loads((folder / "_definitions.json").read_text())
    return loaded


def validate_kuberay(obj: dict[str, Any], version: str) -> None:
    """Validate a RayCluster or RayJob against tests/deploy/kuberay_schema.py, its embedded Kubernetes types
    (pod templates, ...) against the strict schemas of Kubernetes `version`."""
    schema = KUBERAY_SCHEMAS[obj.get("kind", "")]
    registry: Registry[Any] = Resource.from_contents(_k8s_definitions(version)) @ Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(obj)


def validate_any(obj: dict[str, Any], version: str) -> None:
    """Validate `obj` with whichever schema its kind has."""
    if obj.get("apiVersion") == "ray.io/v1":
        validate_kuberay(obj, version)
    else:
        validate_core(obj, version)


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec in a Kubernetes object, with where it sits (none for a Secret)."""
    spec = obj.get("spec", {})
    kind = obj["kind"]
    if kind == "Job":
        yield "template", spec["template"]["spec"]
    elif kind == "CronJob":
        yield "jobTemplate", spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "RayCluster":
        yield "head", spec["headGroupSpec"]["template"]["spec"]
        for group in spec.get("workerGroupSpecs", []):
            yield f"worker group {group['groupName']}", group["template"]["spec"]
    elif kind == "RayJob":
        if "submitterPodTemplate" in spec:
            yield "submitter", spec["submitterPodTemplate"]["spec"]
        if "rayClusterSpec" in spec:
            yield from pod_specs({"kind": "RayCluster", "spec": spec["rayClusterSpec"]})


def containers(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container (init containers too) in a Kubernetes object, with where it sits."""
    for where, pod in pod_specs(obj):
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            yield f"{obj['kind']}/{obj['metadata']['name']} {where} {container['name']}", container


def env_var(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The container's env entry `name`, if it has one."""
    return next((entry for entry in container.get("env", []) if entry["name"] == name), None)


# --- Dockerfiles ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    arguments: str
    line: int


def dockerfile(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile, without comments, continuation lines joined."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
    return instructions


def exec_form(arguments: str) -> list[str]:
    """The argument list of an exec-form instruction (`["a", "b"]`); shell form is split like a shell."""
    if arguments.startswith("["):
        parsed = json.loads(arguments)
        assert isinstance(parsed, list)
        return [str(part) for part in parsed]
    return shlex.split(arguments)


@cache
def image_entrypoints() -> dict[str, list[str]]:
    """The ENTRYPOINT of each image, by the image name the manifests use (posbias-cpu, posbias-gpu)."""
    entrypoints: dict[str, list[str]] = {}
    for path in DOCKERFILES:
        name = "posbias-" + path.suffix.lstrip(".")
        found = [exec_form(i.arguments) for i in dockerfile(path) if i.keyword == "ENTRYPOINT"]
        entrypoints[name] = found[-1]
    return entrypoints


def image_name(image: str) -> str:
    """`registry/path/posbias-gpu:0.1.0` (or `...@sha256:...`) -> `posbias-gpu`."""
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


# --- posbias commands the deployment files run -----------------------------------------------------------


@dataclass(frozen=True)
class Invocation:
    """A `posbias` command line found in a deployment file."""

    source: str
    argv: tuple[str, ...]
    """The arguments after `posbias`."""

    @property
    def id(self) -> str:
        return f"{self.source}: posbias {' '.join(self.argv)}"


WRAPPERS = {"exec", "tini", "--", "env", "nohup", "time"}


def _posbias_argv(argv: list[str]) -> tuple[str, ...] | None:
    """The arguments of `posbias` when it is the program `argv` runs, possibly behind wrappers (`tini --`,
    `exec`, `timeout 60`, `VAR=value`, `kubectl exec POD --`, `docker compose exec SERVICE`); else None."""
    words = list(argv)
    if words and words[0] == "kubectl":  # kubectl exec POD -- posbias ...
        if "--" in words:
            return _posbias_argv(words[words.index("--") + 1 :])
        return None
    if words and words[0] == "docker":  # docker compose [-f FILE] exec|run [--rm ...] SERVICE posbias ...
        verb = next((i for i, w in enumerate(words) if w in ("exec", "run")), None)
        if verb is None:
            return None
        rest = [w for w in words[verb + 1 :]]
        while rest and rest[0].startswith("-"):
            rest.pop(0)
        return _posbias_argv(rest[1:])
    while words and (words[0] in WRAPPERS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0])):
        words.pop(0)
    if words and words[0] == "timeout":
        words = words[2:]
    if words and (words[0] == "posbias" or words[0].endswith("/bin/posbias")):
        return tuple(words[1:])
    return None


def _shell_argvs(text: str) -> Iterator[tuple[str, ...]]:
    """The arguments of every `posbias` command in a shell snippet, including inside quoted commands
    (`ray exec CLUSTER 'posbias ...'`, `bash -c '...'`)."""
    for words in _shell_commands(text):
        argv = _posbias_argv(words)
        if argv is not None:
            yield argv
        for word in words:
            if " " in word and "posbias" in word:
                yield from _shell_argvs(word)


def shell_blocks(markdown: str) -> Iterator[str]:
    """The bodies of the fenced code blocks marked bash, sh, shell or console in a Markdown text."""
    body: list[str] | None = None
    collect = False
    for line in markdown.splitlines():
        fence = re.match(r"\s*```\s*(\w*)", line)
        if fence and body is None:
            body, collect = [], fence.group(1) in ("bash", "sh", "shell", "console")
        elif fence and body is not None:
            if collect:
                yield "\n".join(body)
            body = None
        elif body is not None:
            body.append(line)


def _container_argv(container: dict[str, Any], *, image_entrypoint: list[str]) -> list[str]:
    # Kubernetes: `command` replaces the image's ENTRYPOINT, `args` its CMD.
    command = container.get("command") or image_entrypoint
    return [*command, *container.get("args", [])]


def _shell_commands(text: str) -> Iterator[list[str]]:
    """Command lines of a shell snippet: continuation lines joined, split at `;`, `&&`, `||` and pipes."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"^\$\s+", "", line)  # a prompt in the docs
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            if words:
                yield words


def invocations() -> list[Invocation]:
    """Every `posbias` command in the manifests, the compose file, the Dockerfiles, the shell scripts and
    the runbook's code blocks."""
    found: list[Invocation] = []
    entrypoints = image_entrypoints()

    for path, obj in kube_objects():
        if obj["kind"] == "RayJob" and obj["spec"].get("entrypoint"):
            argv = _posbias_argv(shlex.split(obj["spec"]["entrypoint"]))
            if argv is not None:
                found.append(Invocation(f"{path.name} entrypoint", argv))
        for where, container in containers(obj):
            init = any(container is c for _, pod in pod_specs(obj) for c in pod.get("initContainers", []))
            if obj["kind"] in ("RayCluster", "RayJob") and not init:
                continue  # KubeRay sets the command of Ray containers (`ray start`) and submitters
            argv = _posbias_argv(
                _container_argv(
                    container, image_entrypoint=entrypoints.get(image_name(container["image"]), [])
                )
            )
            if argv is not None:
                found.append(Invocation(f"{path.name} {where}", argv))

    compose = load_docs(DEPLOY / "compose.yaml")[0]
    for name, service in compose["services"].items():
        image = image_name(str(service.get("image", "")).replace("${POSBIAS_IMAGE:-", "").rstrip("}"))
        entrypoint = service.get("entrypoint") or entrypoints.get(image, [])
        command = service.get("command", [])
        argv = _posbias_argv([*entrypoint, *(shlex.split(command) if isinstance(command, str) else command)])
        if argv is not None:
            found.append(Invocation(f"compose.yaml {name}", argv))
        test = service.get("healthcheck", {}).get("test", [])
        argv = _posbias_argv(test[1:] if test and test[0] in ("CMD", "CMD-SHELL") else test)
        if argv is not None:
            found.append(Invocation(f"compose.yaml {name} healthcheck", argv))

    for path in DOCKERFILES:
        for instruction in dockerfile(path):
            if instruction.keyword == "HEALTHCHECK":
                _, _, command = instruction.arguments.partition("CMD ")
                argv = _posbias_argv(exec_form(command.strip()))
                if argv is not None:
                    found.append(Invocation(f"{path.name} HEALTHCHECK", argv))
            elif instruction.keyword == "RUN":
                found += [Invocation(f"{path.name} RUN", a) for a in _shell_argvs(instruction.arguments)]

    for path in SCRIPTS:
        found += [Invocation(path.name, argv) for argv in _shell_argvs(path.read_text())]

    for block in shell_blocks((DEPLOY / "README.md").read_text()):
        found += [Invocation("README.md", argv) for argv in _shell_argvs(block)]
    return found

"""JSON schemas of KubeRay's RayCluster and RayJob (API ray.io/v1), for checking deploy/kuberay offline.

Written by hand from the Go types that KubeRay generates its CRDs from (ray-operator/apis/ray/v1,
raycluster_types.go and rayjob_types.go, as of KubeRay 1.3/1.4, plus `authOptions` of KubeRay 1.5.1/1.6, in
the fields KubeRay 1.6.2's API reference lists): every field those types declare, with its
JSON name and type, required where the Go field has neither `omitempty` nor `+optional`, and enums where the
types declare them (`+kubebuilder:validation:Enum` or the XValidation rules). Unknown fields are rejected, as
the API server's structural-schema pruning would silently drop them. The embedded Kubernetes types (pod
templates, Service, ResourceRequirements, EnvVar, ...) are not copied here: they refer to the strict
Kubernetes schemas that kubernetes-validate ships, so a pod template inside a RayCluster is checked exactly
like one inside a Job.

What this does not check: CEL rules beyond the enums (e.g. managedBy's immutability), defaulting, and what
the KubeRay webhook or controller would refuse at run time (e.g. a worker group whose minReplicas exceeds
maxReplicas; tests/deploy/test_kuberay.py checks the ones that matter to posbias itself).
"""

from __future__ import annotations

from typing import Any

K8S = "https://kubernetes.io/api/_definitions.json#/$defs/"


def _k8s(name: str) -> dict[str, Any]:
    return {"$ref": K8S + name}


def _obj(properties: dict[str, Any], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
POD_TEMPLATE = _k8s("io.k8s.api.core.v1.PodTemplateSpec")
MANAGED_BY = {"type": "string", "enum": ["ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"]}

_REDIS_CREDENTIAL = _obj({"valueFrom": _k8s("io.k8s.api.core.v1.EnvVarSource"), "value": {"type": "string"}})

DEFS: dict[str, Any] = {
    "AutoscalerOptions": _obj(
        {
            "resources": _k8s("io.k8s.api.core.v1.ResourceRequirements"),
            "image": {"type": "string"},
            "imagePullPolicy": {"type": "string", "enum": ["Always", "Never", "IfNotPresent"]},
            "securityContext": _k8s("io.k8s.api.core.v1.SecurityContext"),
            "idleTimeoutSeconds": INT32,
            "upscalingMode": {"type": "string", "enum": ["Default", "Aggressive", "Conservative"]},
            "env": {"type": "array", "items": _k8s("io.k8s.api.core.v1.EnvVar")},
            "envFrom": {"type": "array", "items": _k8s("io.k8s.api.core.v1.EnvFromSource")},
            "volumeMounts": {"type": "array", "items": _k8s("io.k8s.api.core.v1.VolumeMount")},
        }
    ),
    "GcsFaultToleranceOptions": _obj(
        {
            "redisUsername": _REDIS_CREDENTIAL,
            "redisPassword": _REDIS_CREDENTIAL,
            "externalStorageNamespace": {"type": "string"},
            "redisAddress": {"type": "string"},
        },
        required=("redisAddress",),
    ),
    "HeadGroupSpec": _obj(
        {
            "template": POD_TEMPLATE,
            "headService": _k8s("io.k8s.api.core.v1.Service"),
            "enableIngress": {"type": "boolean"},
            "rayStartParams": STRING_MAP,
            "serviceType": {"type": "string"},
        },
        required=("template", "rayStartParams"),
    ),
    "WorkerGroupSpec": _obj(
        {
            "suspend": {"type": "boolean"},
            "groupName": {"type": "string", "minLength": 1},
            "replicas": INT32,
            "minReplicas": INT32,
            "maxReplicas": INT32,
            "idleTimeoutSeconds": INT32,
            "rayStartParams": STRING_MAP,
            "template": POD_TEMPLATE,
            "scaleStrategy": _obj({"workersToDelete": {"type": "array", "items": {"type": "string"}}}),
            "numOfHosts": INT32,
        },
        required=("groupName", "template", "rayStartParams", "minReplicas", "maxReplicas"),
    ),
    "AuthOptions": _obj(
        {
            "mode": {"type": "string", "enum": ["disabled", "token"]},
            "secretName": {"type": "string"},
            "enableK8sTokenAuth": {"type": "boolean"},
        }
    ),
    "RayClusterSpec": _obj(
        {
            "authOptions": {"$ref": "#/$defs/AuthOptions"},
            "suspend": {"type": "boolean"},
            "managedBy": MANAGED_BY,
            "autoscalerOptions": {"$ref": "#/$defs/AutoscalerOptions"},
            "headServiceAnnotations": STRING_MAP,
            "enableInTreeAutoscaling": {"type": "boolean"},
            "gcsFaultToleranceOptions": {"$ref": "#/$defs/GcsFaultToleranceOptions"},
            "headGroupSpec": {"$ref": "#/$defs/HeadGroupSpec"},
            "rayVersion": {"type": "string"},
            "workerGroupSpecs": {"type": "array", "items": {"$ref": "#/$defs/WorkerGroupSpec"}},
        },
        required=("headGroupSpec",),
    ),
    "RayJobSpec": _obj(
        {
            "activeDeadlineSeconds": INT32,
            "backoffLimit": INT32,
            "rayClusterSpec": {"$ref": "#/$defs/RayClusterSpec"},
            "submitterPodTemplate": POD_TEMPLATE,
            "metadata": STRING_MAP,
            "clusterSelector": STRING_MAP,
            "submitterConfig": _obj({"backoffLimit": INT32}),
            "managedBy": MANAGED_BY,
            "deletionPolicy": {
                "type": "string",
                "enum": ["DeleteCluster", "DeleteWorkers", "DeleteSelf", "DeleteNone"],
            },
            "entrypoint": {"type": "string"},
            "runtimeEnvYAML": {"type": "string"},
            "jobId": {"type": "string"},
            "submissionMode": {"type": "string", "enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
            "entrypointResources": {"type": "string"},
            "entrypointNumCpus": {"type": "number"},
            "entrypointNumGpus": {"type": "number"},
            "ttlSecondsAfterFinished": INT32,
            "shutdownAfterJobFinishes": {"type": "boolean"},
            "suspend": {"type": "boolean"},
        }
    ),
}


def _resource(kind: str, spec: str) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://posbias.invalid/kuberay/{kind.lower()}.json",
        "type": "object",
        "properties": {
            "apiVersion": {"const": "ray.io/v1"},
            "kind": {"const": kind},
            "metadata": _k8s("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            "spec": {"$ref": f"#/$defs/{spec}"},
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "$defs": DEFS,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "RayCluster": _resource("RayCluster", "RayClusterSpec"),
    "RayJob": _resource("RayJob", "RayJobSpec"),
}

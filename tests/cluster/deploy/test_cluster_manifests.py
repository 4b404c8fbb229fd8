"""The deployment files in cluster/: KubeRay manifests against the KubeRay CRDs, the cluster-launcher
YAML against the schema in the Ray wheel, the Dockerfile against what the manifests expect of the
image, and the entry points they name started the way the manifests start them, on a local cluster.

Schema checks are strict where Kubernetes is: an object schema of a CRD that lists its properties
gets ``additionalProperties: false`` (the API server rejects unknown fields under kubectl's default
strict field validation), so a misspelt field fails here as it would in ``kubectl apply``. CEL rules
(``x-kubernetes-validations``) and formats are not evaluated; no manifest sets a field they guard.

The local runs replace only what a laptop lacks (documented at each swap): GPUs (0 GPUs, the no-op
engine instead of vLLM, which loads the model's protocol and tokenizer only), the buckets (the same
bucket names on a loopback S3 server, named by ``--s3-endpoint`` / ``storage.endpoint``), the
image's code folder (this checkout), and the cluster's size.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request

import jsonschema
import pytest
import yaml

from tests.conftest import BIN, ROOT, _env, _free_port

KUBERAY_VERSION = "v1.7.0"
CRDS = os.path.join(ROOT, "tests", "data", "kuberay", KUBERAY_VERSION)
CLUSTER = os.path.join(ROOT, "cluster")
MANIFESTS = {"RayCluster": "kuberay/raycluster.yaml", "RayJob": "kuberay/rayjob-batch-parse.yaml",
             "RayService": "kuberay/rayservice.yaml"}
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml",
             "RayService": "ray.io_rayservices.yaml"}
APP_DIR = "/opt/padoc-ray"  # where cluster/Dockerfile puts the code; the manifests name scripts under it
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 1-1.4 MB of YAML each


def _read(path: str, mode: str = "r"):
    with open(path, mode) as f:
        return f.read()


def _load(rel: str) -> dict:
    with open(os.path.join(CLUSTER, rel)) as f:
        return yaml.load(f, Loader=Loader)


# ---- KubeRay CRD schemas ------------------------------------------------------------------------------
_OBJECT_META = {  # the API server's own checks on the fields the manifests use
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}


def _strict(schema):
    """A copy of an OpenAPI v3 structural schema where every object that lists its properties refuses
    others (unless it preserves unknown fields or already says what extra keys may be)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


_VALIDATORS: dict[str, tuple[dict, jsonschema.protocols.Validator]] = {}


def crd_validator(kind: str):
    """(the CRD, a validator for its served v1 schema, strict as above)."""
    if kind not in _VALIDATORS:
        with open(os.path.join(CRDS, CRD_FILES[kind])) as f:
            crd = yaml.load(f, Loader=Loader)
        assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
        v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        assert v1["served"] and v1["storage"]
        schema = _strict(v1["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = _OBJECT_META
        schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
        schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/v1"}
        schema["properties"]["kind"] = {"const": kind}
        jsonschema.Draft7Validator.check_schema(schema)
        _VALIDATORS[kind] = (crd, jsonschema.Draft7Validator(schema))
    return _VALIDATORS[kind]


def crd_errors(kind: str, manifest: dict) -> list[str]:
    _, v = crd_validator(kind)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(manifest)]


def cluster_specs(kind: str, m: dict) -> dict:
    return {"RayCluster": lambda: m["spec"], "RayJob": lambda: m["spec"]["rayClusterSpec"],
            "RayService": lambda: m["spec"]["rayClusterConfig"]}[kind]()


def pods(spec: dict):
    yield "head", spec["headGroupSpec"]
    for g in spec.get("workerGroupSpecs", []):
        yield g["groupName"], g


@pytest.mark.parametrize("kind", sorted(MANIFESTS))
def test_kuberay_manifest_matches_crd(kind):
    m = _load(MANIFESTS[kind])
    assert m["kind"] == kind
    assert crd_errors(kind, m) == []


@pytest.mark.parametrize("kind,mutate,expect", [
    ("RayCluster", lambda m: m["spec"]["workerGroupSpecs"][0].update(rayStartParam={}), "rayStartParam"),
    ("RayCluster", lambda m: m["spec"]["authOptions"].update(mode="none"), "'none' is not one of"),
    ("RayJob", lambda m: m["spec"].update(backoffLimit="2"), "'2' is not of type 'integer'"),
    ("RayJob", lambda m: m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
     .update(resource={}), "'resource' was unexpected"),
    ("RayService", lambda m: m["spec"].pop("rayClusterConfig"), "'rayClusterConfig' is a required property"),
    ("RayService", lambda m: m.update(apiVersion="ray.io/v1alpha2"), "ray.io/v1"),
])
def test_crd_validation_rejects_broken_manifests(kind, mutate, expect):
    """The checks above can fail: a misspelt field, a wrong type, an enum value, a missing required
    field and a wrong API version are each reported."""
    m = copy.deepcopy(_load(MANIFESTS[kind]))
    mutate(m)
    errors = crd_errors(kind, m)
    assert errors and any(expect in e for e in errors), errors


def _start_params_ok(params: dict) -> None:
    """rayStartParams become `ray start --KEY=VALUE` flags (KubeRay adds --head/--address itself):
    each must be an option of this Ray's `ray start`."""
    from ray.scripts.scripts import start

    args = [f"--{k}={v}" for k, v in params.items()]
    start.make_context("start", args)  # click parses (and type-checks) without running


def test_manifests_agree_with_the_image_and_each_other():
    import ray

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        import tomllib

        extras = tomllib.load(f)["project"]["optional-dependencies"]
    ray_pin = next(r for r in extras["ray"] if r.startswith("ray["))
    assert ray_pin.endswith(f"=={ray.__version__}")
    docker = _read(os.path.join(CLUSTER, "Dockerfile"))
    cache = re.search(r"PADOC_RAY_MODEL_CACHE=(\S+)", docker).group(1)
    images = set()
    for kind, rel in MANIFESTS.items():
        spec = cluster_specs(kind, _load(rel))
        assert spec["rayVersion"] == ray.__version__, kind
        assert spec["authOptions"]["mode"] == "token", kind  # token auth stays on (cluster/README.md)
        for group, g in pods(spec):
            _start_params_ok(g.get("rayStartParams", {}))
            pod = g["template"]["spec"]
            (c,) = pod["containers"]
            images.add(c["image"])
            res = c["resources"]
            assert res["requests"] == res["limits"], (kind, group)  # guaranteed QoS: no eviction mid-job
            mounts = {v["mountPath"]: v["name"] for v in c.get("volumeMounts", [])}
            assert "/dev/shm" in mounts  # the object store lives in /dev/shm (64 MB by default in a pod)
            if group == "head":
                assert g["rayStartParams"]["num-cpus"] == "0" and "nvidia.com/gpu" not in res["limits"]
                continue
            if "nvidia.com/gpu" in res["limits"]:
                assert int(res["limits"]["nvidia.com/gpu"]) >= 1 and g["maxReplicas"] >= g["minReplicas"]
                # the model copy goes to a volume (GBs), the folder the image's PADOC_RAY_MODEL_CACHE is in
                assert any(cache.startswith(p.rstrip("/") + "/") for p in mounts), (kind, group, mounts)
    assert len(images) == 1, images  # one image, cluster/Dockerfile's


def test_dockerfile_installs_the_gpu_profile_as_non_root():
    text = _read(os.path.join(CLUSTER, "Dockerfile"))
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0].startswith("FROM python:3.11")  # pyproject: requires-python >=3.11,<3.13
    assert any(ln.startswith("RUN pip install '.[gpu]'") for ln in lines)
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith("0:")
    assert re.search(r"PADOC_RAY_MODEL_CACHE=/\S+", text)
    copies = [ln.split()[1:] for ln in lines if ln.startswith("COPY ")]
    for *srcs, _ in copies:
        for s in srcs:
            assert os.path.exists(os.path.join(ROOT, s)), s
    # the job scripts the manifests name are copied to APP_DIR
    assert f"WORKDIR {APP_DIR}" in lines and ["jobs", "./jobs"] in copies
    ignore = _read(os.path.join(CLUSTER, "Dockerfile.dockerignore")).split()
    for *srcs, _ in copies:
        for s in srcs:
            assert f"!{s.rstrip('/')}" in ignore or f"!{s.rstrip('/')}/" in ignore, s


# ---- the cluster launcher YAML --------------------------------------------------------------------
def test_launcher_yaml_matches_the_ray_schema():
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config
    from ray.scripts.scripts import start

    cfg = _load("aws/cluster.yaml")
    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(cfg, schema)  # the file as written
    validate_config(prepare_config(copy.deepcopy(cfg)))  # what `ray up` checks after filling defaults
    types = cfg["available_node_types"]
    gpu = {n: t for n, t in types.items() if t["resources"].get("GPU")}
    assert gpu and all(t["max_workers"] > t["min_workers"] == 0 for t in gpu.values())  # autoscaled from 0
    assert any(t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot" for t in gpu.values())
    assert cfg["head_node_type"] in types and types[cfg["head_node_type"]]["resources"] == {"CPU": 0}
    assert cfg["docker"]["image"] == cluster_specs("RayCluster", _load(MANIFESTS["RayCluster"]))[
        "headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    for cmd in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]:
        for part in cmd.split(";"):
            words = shlex.split(part)
            while words and "=" in words[0]:  # leading VAR=value
                assert words[0] == "RAY_AUTH_MODE=token"
                words = words[1:]
            if words[:2] == ["ray", "start"]:  # each flag is one of this Ray's `ray start` options
                args = [w.replace("$RAY_HEAD_IP", "127.0.0.1").replace("~", "/home/ray") for w in words[2:]]
                start.make_context("start", args)
                assert part.lstrip().startswith("RAY_AUTH_MODE=token")
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["gpu_spot"]["min_worker"] = 1
    with pytest.raises(jsonschema.ValidationError, match="min_worker"):
        jsonschema.validate(bad, schema)


# ---- the entry points, started as the manifests start them -----------------------------------------
def rayjob_entrypoint() -> tuple[list[str], dict]:
    m = _load(MANIFESTS["RayJob"])["spec"]
    return shlex.split(m["entrypoint"]), yaml.safe_load(m.get("runtimeEnvYAML") or "{}")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_rayjob_flags_are_the_batch_jobs():
    """The entrypoint is jobs/batch_parse.py with flags its own parser accepts, asking for as many
    GPUs per actor as a GPU pod has and no more engine actors than GPU pods."""
    from padoc_ray.cli.batch import DESCRIPTION, add_batch_args, config_from_args
    from padoc_ray.cli.common import job_parser

    argv, _ = rayjob_entrypoint()
    assert argv[:2] == ["python", f"{APP_DIR}/jobs/batch_parse.py"]
    p = job_parser("batch_parse.py", DESCRIPTION, add_batch_args)  # what jobs/batch_parse.py parses with
    cfg = config_from_args(p.parse_args(argv[2:]))
    assert all(u.startswith("s3://") for u in (cfg.input, cfg.output, cfg.model))
    spec = _load(MANIFESTS["RayJob"])["spec"]["rayClusterSpec"]
    limits = {name: g["template"]["spec"]["containers"][0]["resources"]["limits"] for name, g in pods(spec)}
    gpu = [g for name, g in pods(spec) if "nvidia.com/gpu" in limits[name]]
    per_pod = int(limits[gpu[0]["groupName"]]["nvidia.com/gpu"])
    assert cfg.engines.gpus_per_actor == 1 and cfg.engines.num_actors[1] <= sum(g["maxReplicas"] for g in gpu) * per_pod


@pytest.fixture(scope="module")
def buckets(s3, tiny_model_dir):
    """The manifests' own bucket names on the loopback S3 server: the examples as input, the tiny model
    (its tokenizer and protocol are what the no-op engine loads) as the model."""
    c = s3["client"]
    argv, _ = rayjob_entrypoint()
    in_bucket, in_prefix = _flag(argv, "--input")[5:].split("/", 1)
    model_bucket, model_prefix = _flag(argv, "--model")[5:].split("/", 1)
    out_bucket = _flag(argv, "--output")[5:].split("/", 1)[0]
    for b in {in_bucket, model_bucket, out_bucket}:
        c.create_bucket(Bucket=b)
    pdfs = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".pdf"))
    for f in pdfs:
        c.upload_file(os.path.join(ROOT, "examples", f), in_bucket, in_prefix.rstrip("/") + "/" + f)
    for f in os.listdir(tiny_model_dir):
        c.upload_file(os.path.join(tiny_model_dir, f), model_bucket, model_prefix.rstrip("/") + "/" + f)
    import pypdfium2

    pages = sum(len(pypdfium2.PdfDocument(os.path.join(ROOT, "examples", f))) for f in pdfs)
    return {"pdfs": pdfs, "pages": pages}


def _run(cmd, log_path, env, timeout=240) -> tuple[int, str]:
    with open(log_path, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False).returncode
    return rc, _read(log_path)


@pytest.mark.slow
def test_rayjob_entrypoint_runs_on_a_local_cluster(ray_cluster, s3, buckets, deployed_service, tmp_path):
    """Submitted as KubeRay's submitter does (`ray job submit --runtime-env-json <runtimeEnvYAML> --
    <entrypoint>` in a shell, which splits the entrypoint into words), with these swaps: the script path under the
    image's APP_DIR -> this checkout; `--s3-endpoint` added (the same bucket names on the loopback S3
    server; its test credentials join the runtime env's env_vars); `--gpus-per-actor 0`, `--actors 1`,
    `--cpus-per-actor 0.5` and `--engine noop` (no GPU here; the no-op engine answers every page with an
    empty layout after loading the model's protocol and tokenizer from the S3 copy). The RayService
    (``deployed_service``) shares the cluster and starts meanwhile, as on a RayCluster serving both."""
    argv, runtime_env = rayjob_entrypoint()
    swaps = {"--gpus-per-actor": "0", "--actors": "1", "--cpus-per-actor": "0.5"}
    local = [a.replace(APP_DIR, ROOT, 1) if a.startswith(APP_DIR + "/") else a for a in argv]
    for flag, value in swaps.items():
        local[local.index(flag) + 1] = value
    local += ["--engine", "noop", "--s3-endpoint", s3["endpoint"]]
    runtime_env.setdefault("env_vars", {}).update(s3["env"])
    cmd = [os.path.join(BIN, "ray"), "job", "submit", "--address", ray_cluster["dashboard"],
           "--runtime-env-json", json.dumps(runtime_env), "--", *local]
    rc, log = _run(cmd, tmp_path / "job.log", _env())
    assert rc == 0, log[-6000:]
    out_bucket, out_prefix = _flag(argv, "--output")[5:].split("/", 1)
    c = s3["client"]
    summary = json.loads(c.get_object(Bucket=out_bucket, Key=f"{out_prefix}/summary.json")["Body"].read())
    assert summary["all_inputs_accounted"] is True
    assert summary["document_status"] == {"ok": len(buckets["pdfs"])}
    assert summary["config"]["host"]["engine"] == "noop"
    assert summary["config"]["rows_per_file"] == int(_flag(argv, "--rows-per-file"))
    assert summary["pages_written"] == buckets["pages"] and summary["page_status"] == {"ok": buckets["pages"]}
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=out_bucket, Prefix=f"{out_prefix}/pages/")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys)
    docs = [o["Key"] for o in c.list_objects_v2(Bucket=out_bucket, Prefix=f"{out_prefix}/documents/")["Contents"]]
    assert any(k.endswith(".parquet") for k in docs)


def _serve_config() -> dict:
    return yaml.safe_load(_load(MANIFESTS["RayService"])["spec"]["serveConfigV2"])


def test_rayservice_config_is_the_serve_app():
    """serveConfigV2 passes Serve's own schema, names cluster/serve.yaml's import path, and its args
    build the application through that path (ServeConfig validates every key) with a GPU engine."""
    from ray.serve._private.utils import import_attr
    from ray.serve.schema import ServeDeploySchema

    cfg = _serve_config()
    ServeDeploySchema.model_validate(cfg)  # what the Serve REST API checks (KubeRay sends it there)
    local = yaml.safe_load(_read(os.path.join(CLUSTER, "serve.yaml")))
    (app,) = cfg["applications"]
    assert app["import_path"] == local["applications"][0]["import_path"]
    from padoc_ray.serve.config import ServeConfig

    sc = ServeConfig.from_args(app["args"])
    assert sc.engine_gpus == 1 and sc.model.startswith("s3://")
    assert cfg["http_options"]["request_timeout_s"] == sc.http_request_timeout_s  # Serve's limit backs up ours
    built = import_attr(app["import_path"])(app["args"])
    engine = built._bound_deployment.init_args[1]._bound_deployment  # Ingress.bind(cfg, engine.bind(cfg))
    assert engine.ray_actor_options["num_gpus"] == 1
    spec = _load(MANIFESTS["RayService"])["spec"]["rayClusterConfig"]
    gpu_pods = sum(g["maxReplicas"] for name, g in pods(spec) if name != "head")
    assert sc.engine_replicas[1] <= gpu_pods  # every engine replica can get a GPU pod


def _get(url: str, headers: dict | None = None, data: bytes | None = None, timeout: float = 10):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def deployed_service(ray_cluster, s3, buckets, tmp_path_factory):
    """rayservice.yaml's serveConfigV2 deployed as KubeRay deploys it (to the dashboard's Serve REST API:
    `serve deploy -a`, which returns once the config is accepted), with these swaps: http_options host
    127.0.0.1 and a free port; the same buckets on the loopback S3 server (`storage.endpoint`;
    credentials and the API token in the application's runtime_env, where Kubernetes has the pods'
    ServiceAccount and Secret); the no-op engine, 0 GPUs, fractional CPUs, one ingress replica.
    Started before the RayJob test submits its job, so the service comes up while the job runs;
    the service test checks that `serve deploy` succeeded."""
    tmp = tmp_path_factory.mktemp("serve")
    cfg = _serve_config()
    port = _free_port()
    cfg["http_options"].update(host="127.0.0.1", port=port)
    (app,) = cfg["applications"]
    token = "cluster-manifest-test-token"
    app["runtime_env"] = {"env_vars": {**s3["env"], "PADOC_RAY_API_TOKEN": token,
                                       "PADOC_RAY_JOB_KEY": os.urandom(32).hex()}}
    app["args"].update(storage={"endpoint": s3["endpoint"]}, engine_gpus=0, engine_cpus=0.25, ingress_cpus=0.25,
                       ingress_replicas=1, engine_replicas=[1, 1], render_workers=1)
    app["args"]["host"].update(engine="noop")
    path = tmp / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp / "deploy.log"
    with open(log, "w") as f:  # in the background: the RayJob test runs meanwhile
        proc = subprocess.Popen([os.path.join(BIN, "serve"), "deploy", str(path), "-a", ray_cluster["dashboard"]],
                                stdout=f, stderr=subprocess.STDOUT, env=_env())
    yield {"base": f"http://127.0.0.1:{port}", "token": token, "deploy": proc, "log": log}
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_rayservice_deploys_on_a_local_cluster(deployed_service, buckets):
    """The service deployed from the manifest's serveConfigV2 becomes ready, asks for the token it
    was built with, and parses a PDF (its pages through the no-op engine)."""
    base, token = deployed_service["base"], deployed_service["token"]
    rc = deployed_service["deploy"].wait(timeout=120)
    assert rc == 0, deployed_service["log"].read_text()[-4000:]
    deadline, status = time.time() + 120, None
    while time.time() < deadline:
        try:
            status, _ = _get(f"{base}/readyz", timeout=5)
        except OSError:
            status = None
        if status == 200:
            break
        time.sleep(1)
    assert status == 200, status
    assert _get(f"{base}/v1/models")[0] == 401  # the token from the application's environment is required
    pdf = _read(os.path.join(ROOT, "examples", buckets["pdfs"][0]), "rb")
    import base64

    body = json.dumps({"content_base64": base64.b64encode(pdf).decode(), "filename": buckets["pdfs"][0]}).encode()
    code, out = _get(f"{base}/v1/parse", {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                     body, timeout=60)
    assert code == 200, out[:2000]
    res = json.loads(out)
    assert res["status"] == "ok" and res["pages"] and all(p["status"] == "ok" for p in res["pages"])

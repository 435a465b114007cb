#!/usr/bin/python3
"""tests/deploy/check_manifests.py - the Kubernetes manifests of docs/deploy/ hold together
as docs/deploy.md describes them, without a cluster, kubectl or the network.

usage: check_manifests.py SOURCE_ROOT   exits 0 when all holds, 1 with each breach listed,
77 (skipped) without PyYAML (Debian's python3-yaml).

Per document: a known kind with its apiVersion, metadata.name, a selector that matches its
pod template. Per pod: named containers with images, command lines of strings, mounts of
declared volumes, the security settings docs/deploy.md promises (non-root, RuntimeDefault
seccomp, no privilege escalation, no host namespaces or hostPath), memory limits. Per
pool (read from the command lines: xmemsink and xmemsrc pool-name=, the bridge scripts,
xmem-inspect probes): one producer in the pod; a socket path that reaches the same file of
the same Memory emptyDir from every container; uids the producer's perms and group admit;
for a CUDA pool, one GPU claim shared by the producer and its consumers. Services reach a
declared port of a pod they select. docs/deploy.md links every manifest, and only those.
"""
import glob
import os
import posixpath
import re
import sys

try:
    import yaml
except ImportError:
    print("skipped: PyYAML is missing (Debian: python3-yaml) for", sys.executable)
    sys.exit(77)

API_VERSIONS = {
    "Pod": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "DaemonSet": "apps/v1",
    "ResourceClaimTemplate": "resource.k8s.io/v1",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")
INSPECT_OPTIONS = {"--json"}  # tools/xmem-inspect.cpp: --json, -h/--help, --, one NAME
GPU_RESOURCE = "nvidia.com/gpu"


class StrictLoader(yaml.SafeLoader):
    """A duplicate key is an error, as kubectl's strict decoding makes it; PyYAML keeps the
    last one silently."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}",
                                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class Report:
    def __init__(self):
        self.errors = []

    def error(self, where, message):
        self.errors.append(f"{where}: {message}")


def mapping(value):
    return value if isinstance(value, dict) else {}


def items(value):
    return value if isinstance(value, list) else []


def pool_uses(argv):
    """(role, pool, details) for each pool ARGV names: role 'produce' or 'consume'."""
    uses = []
    program = posixpath.basename(argv[0]) if argv else ""
    if program == "gst-launch-1.0":
        segments, current = [], []
        for token in argv[1:]:
            if token == "!":
                segments.append(current)
                current = []
            elif not (token.startswith("-") and not segments and not current):
                current.append(token)
        segments.append(current)
        for index, segment in enumerate(segments):
            if not segment or segment[0] not in ("xmemsink", "xmemsrc"):
                continue
            props = dict(t.split("=", 1) for t in segment[1:] if "=" in t)
            pool = props.get("pool-name", "xmem")
            if segment[0] == "xmemsrc":
                uses.append(("consume", pool, props))
                continue
            upstream = " ".join(segments[index - 1]) if index else ""
            props["cuda"] = props.get("memory") == "cuda" or (
                "memory:CUDAMemory" in upstream and props.get("memory") != "system")
            uses.append(("produce", pool, props))
    elif program == "bridge-send.sh" and len(argv) >= 3:
        uses.append(("consume", argv[1], {"send_to": argv[2]}))
    elif program == "bridge-receive.sh" and len(argv) >= 3:
        uses.append(("produce", argv[2], {"listen": argv[1], "cuda": False}))
    return uses


def inspect_pool(argv, report, where):
    """The pool an `xmem-inspect` probe names, checking its options against the tool's."""
    names = [a for a in argv[1:] if not a.startswith("-")]
    for option in (a for a in argv[1:] if a.startswith("-")):
        if option not in INSPECT_OPTIONS:
            report.error(where, f"xmem-inspect has no option {option!r} (tools/xmem-inspect.cpp)")
    if len(names) != 1:
        report.error(where, f"xmem-inspect takes one pool name, given {names}")
        return None
    return names[0]


def resolve_socket(pool, container, volumes, report, where):
    """(volume, path inside it, readOnly) of the socket PATH, through the container's mounts."""
    directory = posixpath.dirname(pool)
    best = None
    for mount in items(container.get("volumeMounts")):
        path = str(mount.get("mountPath", "")).rstrip("/")
        if directory == path or directory.startswith(path + "/"):
            if best is None or len(path) > len(str(best.get("mountPath")).rstrip("/")):
                best = mount
    if best is None:
        report.error(where, f"socket {pool} is on no volume: the other containers cannot reach it")
        return None
    volume = volumes.get(best.get("name"), {})
    empty_dir = volume.get("emptyDir")
    if not isinstance(empty_dir, dict) or empty_dir.get("medium") != "Memory":
        report.error(where, f"socket {pool}: volume {best.get('name')!r} is not an emptyDir "
                     "with medium: Memory")
    inside = posixpath.relpath(pool, str(best["mountPath"]).rstrip("/") or "/")
    inside = posixpath.normpath(posixpath.join(str(best.get("subPath", "")), inside))
    return best.get("name"), inside, bool(best.get("readOnly", False))


def effective(container, pod, key):
    value = mapping(container.get("securityContext")).get(key)
    return value if value is not None else mapping(pod.get("securityContext")).get(key)


def check_security(pod, container, where, report):
    if effective(container, pod, "runAsNonRoot") is not True:
        report.error(where, "runAsNonRoot is not true")
    uid = effective(container, pod, "runAsUser")
    if not isinstance(uid, int) or uid == 0:
        report.error(where, "runAsUser is not a non-zero uid: pool access cannot be checked")
    seccomp = effective(container, pod, "seccompProfile")
    if mapping(seccomp).get("type") != "RuntimeDefault":
        report.error(where, "seccompProfile is not RuntimeDefault")
    context = mapping(container.get("securityContext"))
    if context.get("privileged"):
        report.error(where, "privileged")
    if context.get("allowPrivilegeEscalation") is not False:
        report.error(where, "allowPrivilegeEscalation is not false")
    if "ALL" not in items(mapping(context.get("capabilities")).get("drop")):
        report.error(where, "capabilities do not drop ALL")


def check_resources(container, pod_claims, where, report):
    resources = mapping(container.get("resources"))
    for section in ("requests", "limits"):
        for name, quantity in mapping(resources.get(section)).items():
            if not QUANTITY.match(str(quantity)):
                report.error(where, f"resources.{section}.{name}: {quantity!r} is not a quantity")
    if "memory" not in mapping(resources.get("limits")):
        report.error(where, "no memory limit")
    claims = set()
    for claim in items(resources.get("claims")):
        name = mapping(claim).get("name")
        if name not in pod_claims:
            report.error(where, f"resources.claims names {name!r}, not in the pod's resourceClaims")
        claims.add(name)
    return claims


def gids_of(container, pod):
    context = mapping(pod.get("securityContext"))
    gids = {effective(container, pod, "runAsGroup"), context.get("fsGroup")}
    gids.update(items(context.get("supplementalGroups")))
    return {g for g in gids if isinstance(g, int)}


def check_pod(pod, where, manifests, report):
    """Checks one pod spec; returns its containers' ports as {(name or number, protocol)}."""
    for key in ("hostIPC", "hostPID", "hostNetwork"):
        if pod.get(key):
            report.error(where, f"{key}: xmem needs none (docs/deploy.md)")
    volumes = {}
    for volume in items(pod.get("volumes")):
        name = mapping(volume).get("name")
        if name in volumes:
            report.error(where, f"volume {name!r} declared twice")
        if "hostPath" in mapping(volume):
            report.error(where, f"volume {name!r} is a hostPath")
        volumes[name] = mapping(volume)
    pod_claims = {}
    for claim in items(pod.get("resourceClaims")):
        template = mapping(claim).get("resourceClaimTemplateName")
        if template not in manifests["ResourceClaimTemplate"]:
            report.error(where, f"resourceClaims: no ResourceClaimTemplate {template!r} in docs/deploy/")
        pod_claims[mapping(claim).get("name")] = template
    containers = items(pod.get("containers"))
    if not containers:
        report.error(where, "no containers")
    names, ports, producers, consumers = set(), set(), {}, []
    for container in containers:
        container = mapping(container)
        name = container.get("name")
        at = f"{where} container {name}"
        if not isinstance(name, str) or not DNS_LABEL.match(name) or name in names:
            report.error(at, "a container needs a unique DNS-label name")
        names.add(name)
        if not isinstance(container.get("image"), str) or not container["image"]:
            report.error(at, "no image")
        argv = items(container.get("command")) + items(container.get("args"))
        if not argv or not all(isinstance(a, str) for a in argv):
            report.error(at, f"the command line is not a list of strings: {argv}")
            argv = [str(a) for a in argv]
        for mount in items(container.get("volumeMounts")):
            if mapping(mount).get("name") not in volumes:
                report.error(at, f"volumeMount {mapping(mount).get('name')!r} names no volume of the pod")
            if not str(mapping(mount).get("mountPath", "")).startswith("/"):
                report.error(at, f"mountPath {mapping(mount).get('mountPath')!r} is not absolute")
        check_security(pod, container, at, report)
        claims = check_resources(container, pod_claims, at, report)
        for port in items(container.get("ports")):
            port = mapping(port)
            protocol = port.get("protocol", "TCP")
            ports.add((port.get("containerPort"), protocol))
            if "name" in port:
                ports.add((port["name"], protocol))
        uses = pool_uses(argv)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            command = mapping(mapping(container.get(probe)).get("exec")).get("command")
            if command is None:
                continue
            if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
                report.error(at, f"{probe}: exec.command is not a list of strings")
            elif posixpath.basename(command[0]) == "xmem-inspect":
                pool = inspect_pool(command, report, f"{at} {probe}")
                if pool:
                    uses.append(("inspect", pool, {}))
        for role, pool, props in uses:
            use = {"container": container, "at": at, "role": role, "pool": pool, "props": props,
                   "claims": claims, "uid": effective(container, pod, "runAsUser"),
                   "gids": gids_of(container, pod)}
            if not pool.startswith("@") and "/" not in pool:
                report.error(at, f"pool {pool!r} is a plain name: a socket in this container's own "
                         "default directory; name a path on a shared volume or @name")
                continue
            if "/" in pool and not pool.startswith("@"):
                use["socket"] = resolve_socket(pool, container, volumes, report, at)
            listen = props.get("listen")
            if listen is not None and (int(listen) if listen.isdigit() else listen, "UDP") not in ports:
                report.error(at, f"bridge-receive.sh listens on {props['listen']}, not a UDP containerPort")
            if role == "produce":
                if use.get("socket") and use["socket"][2]:
                    report.error(at, f"the producer of {pool} mounts its socket volume read-only")
                producers.setdefault(pool, []).append(use)
            else:
                consumers.append(use)
    for pool, owners in producers.items():
        if len(owners) > 1:
            report.error(where, f"pool {pool}: {len(owners)} producers; a second owner is refused")
    for use in consumers:
        owners = producers.get(use["pool"])
        if not owners:
            # A path differs between containers: find the producer by the file it reaches.
            owners = [p for ps in producers.values() for p in ps
                  if use.get("socket") and p.get("socket") and p["socket"][:2] == use["socket"][:2]]
        if not owners:
            report.error(use["at"], f"pool {use['pool']}: no container of this pod produces it "
                     "at the same place (volume and path)")
            continue
        owner = owners[0]
        if use.get("socket") and owner.get("socket") and use["socket"][:2] != owner["socket"][:2]:
            report.error(use["at"], f"pool {use['pool']} is {use['socket'][:2]} here but "
                     f"{owner['socket'][:2]} for the producer")
        check_access(owner, use, report)
        if owner["props"].get("cuda") and use["role"] == "consume" and not (owner["claims"] & use["claims"]):
            report.error(use["at"], f"CUDA pool {use['pool']}: no resource claim shared with the "
                     "producer, so nothing says it sees the same GPU")
        if "send_to" in use["props"]:
            check_bridge_target(use, manifests, report)
    if any(u["props"].get("cuda") for us in producers.values() for u in us):
        for container in map(mapping, containers):
            resources = mapping(container.get("resources"))
            if any(GPU_RESOURCE in mapping(resources.get(s)) for s in ("requests", "limits")):
                report.error(f"{where} container {container.get('name')}", f"{GPU_RESOURCE} in a pod "
                         "sharing a CUDA pool: each container requesting it gets its own GPUs; "
                         "share a resource claim instead")
    return ports


def check_access(owner, use, report):
    """The owner's rule (docs/containers.md, "Who may attach"): its uid, or the group with
    the group bits of perms and the pool's group among the peer's gids."""
    if use["uid"] == owner["uid"]:
        return
    perms = int(owner["props"].get("perms", "0600"), 8)
    group = owner["props"].get("group")
    if perms & 0o006 == 0o006:
        return
    if perms & 0o060 != 0o060 or group is None:
        report.error(use["at"], f"uid {use['uid']} is not the producer's {owner['uid']}, and perms "
                 f"{perms:04o} group={group} let no group in")
        return
    if not group.isdigit():
        report.error(use["at"], f"group={group}: a gid is needed to check membership here")
        return
    if int(group) not in use["gids"]:
        report.error(use["at"], f"uid {use['uid']} is not in group {group} (its gids {sorted(use['gids'])})")
    if int(group) not in owner["gids"]:
        report.error(owner["at"], f"the producer is not in its pool's group {group}")


def check_bridge_target(use, manifests, report):
    host, _, port = use["props"]["send_to"].rpartition(":")
    service = manifests["Service"].get(host.split(".")[0])
    if service is None:
        report.error(use["at"], f"bridge-send.sh sends to {host!r}: no Service of that name in docs/deploy/")
        return
    if not any(mapping(p).get("protocol") == "UDP" and str(mapping(p).get("port")) == port
           for p in items(mapping(service.get("spec")).get("ports"))):
        report.error(use["at"], f"Service {host} has no UDP port {port} (SRT is UDP)")


def check_service(doc, where, templates, report):
    spec = mapping(doc.get("spec"))
    selector = mapping(spec.get("selector"))
    matched = [t for t in templates if selector and selector.items() <= t["labels"].items()]
    if not matched:
        report.error(where, f"selector {selector} matches no pod template in docs/deploy/")
    for port in items(spec.get("ports")):
        port = mapping(port)
        protocol = port.get("protocol", "TCP")
        if protocol not in ("TCP", "UDP", "SCTP"):
            report.error(where, f"protocol {protocol!r}")
        if not isinstance(port.get("port"), int) or not 0 < port["port"] < 65536:
            report.error(where, f"port {port.get('port')!r}")
        target = port.get("targetPort", port.get("port"))
        if matched and not any((target, protocol) in t["ports"] for t in matched):
            report.error(where, f"targetPort {target!r}/{protocol} is no containerPort of the "
                         "pods it selects")
    if not items(spec.get("ports")):
        report.error(where, "no ports")


def load(root, report):
    documents = []
    for path in sorted(glob.glob(os.path.join(root, "docs", "deploy", "*.yaml"))):
        relative = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as file:
                loaded = list(yaml.load_all(file, Loader=StrictLoader))
        except yaml.YAMLError as e:
            report.error(relative, f"not YAML: {e}")
            continue
        for index, doc in enumerate(loaded):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                report.error(f"{relative} document {index + 1}", "not a mapping")
                continue
            documents.append((relative, index + 1, doc))
    return documents


def check_links(root, files, report):
    """docs/deploy.md links every manifest, and every manifest it links exists."""
    with open(os.path.join(root, "docs", "deploy.md"), encoding="utf-8") as file:
        text = file.read()
    linked = set(re.findall(r"\]\((deploy/[^)#\s]+)\)", text))
    for relative in files:
        if posixpath.relpath(relative, "docs") not in linked:
            report.error("docs/deploy.md", f"does not link {relative}")
    for link in linked:
        if not os.path.isfile(os.path.join(root, "docs", link)):
            report.error("docs/deploy.md", f"links {link}, which does not exist")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    report = Report()
    documents = load(root, report)
    files = sorted({f for f, _, _ in documents} |
               {os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "deploy", "*.yaml"))})
    if not files:
        report.error("docs/deploy", "no manifest")
    manifests = {kind: {} for kind in API_VERSIONS}
    for relative, index, doc in documents:
        kind, name = doc.get("kind"), mapping(doc.get("metadata")).get("name")
        where = f"{relative} document {index} ({kind} {name})"
        if kind not in API_VERSIONS:
            report.error(where, f"kind {kind!r} is none of {sorted(API_VERSIONS)}")
            continue
        if doc.get("apiVersion") != API_VERSIONS[kind]:
            report.error(where, f"apiVersion {doc.get('apiVersion')!r}, not {API_VERSIONS[kind]}")
        if not isinstance(name, str) or not DNS_LABEL.match(name):
            report.error(where, "metadata.name is not a DNS label")
        elif name in manifests[kind]:
            report.error(where, f"a second {kind} named {name}")
        manifests[kind][name] = doc
    templates = []
    for relative, index, doc in documents:
        kind, name = doc.get("kind"), mapping(doc.get("metadata")).get("name")
        where = f"{relative} ({kind} {name})"
        spec = mapping(doc.get("spec"))
        if kind == "Pod":
            labels, pod = mapping(mapping(doc.get("metadata")).get("labels")), spec
        elif kind in ("Deployment", "DaemonSet"):
            template = mapping(spec.get("template"))
            labels = mapping(mapping(template.get("metadata")).get("labels"))
            pod = mapping(template.get("spec"))
            selector = mapping(mapping(spec.get("selector")).get("matchLabels"))
            if not selector or not selector.items() <= labels.items():
                report.error(where, f"spec.selector.matchLabels {selector} does not match the "
                             "template's labels")
        else:
            continue
        ports = check_pod(pod, where, manifests, report)
        templates.append({"labels": labels, "ports": ports})
    for relative, index, doc in documents:
        if doc.get("kind") == "Service":
            where = f"{relative} (Service {mapping(doc.get('metadata')).get('name')})"
            check_service(doc, where, templates, report)
    check_links(root, files, report)
    for error in report.errors:
        print(error)
    if report.errors:
        print(f"{len(report.errors)} problem(s) in docs/deploy/ and docs/deploy.md")
        return 1
    print(f"ok: {len(documents)} documents in {len(files)} files under docs/deploy/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

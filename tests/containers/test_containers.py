#!/usr/bin/env python3
"""tests/containers: producers and consumers in different PID, mount, user and network
namespaces, made with unshare(1), nsenter(1) and setpriv(1) as container runtimes make
them (docs/containers.md), sharing nothing but the socket's directory or, for an
abstract socket, a network namespace.

Each case checks what a user would: frames bit-exact (the peers check every byte),
consumer and producer SIGKILLs reclaimed, a restarted producer followed, xmem-inspect
telling the truth from each namespace, refused access with an error that names uids,
groups and modes. CUDA pools run on the driver simulator (XMEM_CUDA_DRIVER), which
proves xmem's logic across namespaces, not a driver's.

A case the kernel refuses (no user namespaces, no root for other uids) is reported as
skipped with the reason; the run exits 77 only when every case was skipped. Exit 1 when
any case failed.
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

PEER = os.environ["XMEM_TEST_PEER"]
INSPECT = os.environ["XMEM_INSPECT"]
CUDA_PEER = os.environ.get("XMEM_CUDA_PEER", "")
CUDA_DRIVER = os.environ.get("XMEM_CUDA_DRIVER", "")
GST_LAUNCH = os.environ.get("XMEM_GST_LAUNCH", "")
ROOT = os.geteuid() == 0

# Ids for the cases that run processes as other users (root only): an owner, a member
# of the pool's group, an outsider; none of them need exist in /etc/passwd.
OWNER_UID, MEMBER_UID, OUTSIDER_UID, GROUP = 47101, 47102, 47103, 47100


class Skip(Exception):
    pass


def unshare_prefix(*flags):
    """unshare with FLAGS; without root, inside a user namespace that maps us to root."""
    user = [] if ROOT else ["--user", "--map-root-user"]
    return ["unshare", *user, *flags]


# A process of its own PID namespace (pid 1 there), with /proc remounted for it, killed
# with unshare if unshare dies.
PIDNS = unshare_prefix("--pid", "--fork", "--mount-proc", "--kill-child")


def probe(cmd, what):
    r = subprocess.run(cmd + ["true"], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip("%s: the kernel refused (%s)" % (what, r.stderr.strip() or "exit %d" % r.returncode))


def as_user(uid, groups=()):
    """setpriv(1) prefix running a command as UID, gid UID, with GROUPS as supplementary."""
    if not ROOT:
        raise Skip("running processes as other uids needs root")
    cmd = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid]
    cmd += ["--groups=" + ",".join(str(g) for g in groups)] if groups else ["--clear-groups"]
    return cmd


class Proc:
    """A child with its stdout read line by line (by a thread of its own); stderr kept
    for the report. (Not select() on the pipe and readline(): a read can take two
    lines into the file object's buffer, and select() then waits on the pipe for the
    second, which has come already.)"""

    def __init__(self, cmd, env=None):
        self.cmd = cmd
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, env=env, text=True, bufsize=1)
        self.lines = []
        self.queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.queue.put(line.strip())
        self.queue.put(None)  # end of output

    def _take(self, timeout):
        """The next line, or None at the end of the output or after TIMEOUT seconds."""
        try:
            line = self.queue.get(timeout=max(timeout, 0))
        except queue.Empty:
            return None
        if line is not None:
            self.lines.append(line)
        return line

    def wait_line(self, prefix, timeout=20):
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if line.startswith(prefix):
                return line
        while True:
            line = self._take(deadline - time.monotonic())
            if line is None:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError("%s: no line %r within %ss; output %s; stderr %s" %
                             (self.cmd[-4:], prefix, timeout, self.lines, self.stderr()))

    def finish(self, timeout=60):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not finish within %ss; stderr %s" % (self.cmd, timeout, self.stderr()))
        self.reader.join(timeout=10)
        while self._take(0) is not None:
            pass
        return self.p.returncode

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def inner_pid(self):
        """The pid of the command itself: unshare --fork's child, or the process."""
        if self.cmd[0] != "unshare" or "--fork" not in self.cmd:
            return self.p.pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)) as f:
                    children = f.read().split()
                if children:
                    return int(children[0])
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        raise AssertionError("unshare %d has no child" % self.p.pid)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def result_fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def expect_bit_exact(proc, frames=None, timeout=60):
    """A tests/peer.cpp consumer's verdict: every byte checked, none wrong, no gap."""
    rc = proc.finish(timeout)
    line = next((l for l in proc.lines if l.startswith("received=")), None)
    assert line, "consumer printed no result (rc %d): %s %s" % (rc, proc.lines, proc.stderr())
    f = result_fields(line)
    assert rc == 0 and f["corrupt"] == "0", "consumer rc %d: %s; %s" % (rc, line, proc.stderr())
    if frames is not None:
        assert int(f["received"]) == frames, "consumer received %s of %d frames: %s" % (f["received"], frames, line)
    return f


def inspect(name, prefix=(), text=False):
    r = subprocess.run(list(prefix) + [INSPECT] + ([] if text else ["--json"]) + [name],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "xmem-inspect %s: %s" % (name, r.stderr)
    return r.stdout if text else json.loads(r.stdout)


def wait_for(what, predicate, timeout=10, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("%s: not within %ss" % (what, timeout))


class Case:
    def __init__(self, dir):
        self.dir = dir
        self.procs = []

    def start(self, cmd, env=None):
        p = Proc(cmd, env)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            p.kill()


# --- PID namespaces ---------------------------------------------------------------

def case_pid_namespaces(c):
    """Owner and two consumers each in their own PID namespace: bit-exact frames, and
    xmem-inspect right from the host, from inside a consumer's namespace and from a
    sibling namespace that sees none of them."""
    probe(PIDNS, "PID namespaces")
    path = c.dir + "/pidns"
    prod = c.start(PIDNS + [PEER, "produce", path, "--frames", "600", "--fps", "200", "--size", "65536",
                            "--wait-consumers", "2", "--policy", "block", "--drain"])
    cons = [c.start(PIDNS + [PEER, "consume", path]) for _ in range(2)]
    for k in cons:
        k.wait_line("attached")
    prod.wait_line("ready")
    host_pids = {k.inner_pid() for k in cons}

    # From the host, an ancestor of every namespace: real pids, found through /proc.
    v = inspect(path)
    assert v["owner_pid"] == prod.inner_pid(), v["owner_pid"]
    assert v["owner_own_pid"] == 1, "the owner is pid 1 in its namespace: %s" % v["owner_own_pid"]
    got = {k["pid"] for k in v["consumers"]}
    assert got == host_pids, "host view of consumer pids %s, the processes are %s" % (got, host_pids)
    for k in v["consumers"]:
        assert k["alive"] and k["state"] == "active", k
        assert k["own_pid"] == 1 and k["owner_seen_pid"] == 0, \
            "own pid 1, and 0 from the owner's sibling namespace: %s" % k
        assert k["pid_namespace"] == "visible", k

    # From inside the first consumer's namespace: itself as pid 1, the rest unseen.
    me = cons[0].inner_pid()
    inside = ["nsenter", "--target", str(me), "--pid", "--mount"]
    v = inspect(path, inside)
    mine = [k for k in v["consumers"] if k["pid_namespace"] == "same"]
    others = [k for k in v["consumers"] if k["pid_namespace"] == "other"]
    assert len(mine) == 1 and mine[0]["pid"] == 1, v["consumers"]
    assert len(others) == 1 and others[0]["pid"] is None and others[0]["alive"], v["consumers"]
    assert v["owner_pid"] is None and v["owner_pid_namespace"] == "other", v
    text = inspect(path, inside, text=True)
    assert "in another PID namespace" in text and "other-ns" in text, text

    # From a sibling namespace: nobody's pid, everybody alive.
    v = inspect(path, PIDNS)
    assert v["owner_pid"] is None, v["owner_pid"]
    assert all(k["pid"] is None and k["alive"] for k in v["consumers"]), v["consumers"]
    for k in v["slots"]:
        for bit, pid in zip(k["holder_bits"], k["holders"]):
            assert pid is None, "slot %d holder bit %d shown as pid %s from a sibling namespace" % (
                k["index"], bit, pid)

    assert prod.finish() == 0, prod.stderr()
    for k in cons:
        expect_bit_exact(k, 600)


def case_pid_namespace_kills(c):
    """A consumer SIGKILLed in its own namespace while holding frames gives them back;
    a producer SIGKILLed in its own is followed by its consumer to the next one."""
    probe(PIDNS, "PID namespaces")
    path = c.dir + "/kills"
    prod = c.start(PIDNS + [PEER, "produce", path, "--frames", "1000000", "--fps", "300", "--slots", "8",
                            "--no-eos"])
    prod.wait_line("ready")
    victim = c.start(PIDNS + [PEER, "consume", path, "--hold", "3", "--frames", "3", "--hold-forever"])
    victim.wait_line("holding=3")
    vpid = victim.inner_pid()
    v = inspect(path)
    index = next(k["index"] for k in v["consumers"] if k["pid"] == vpid)
    held = [s["index"] for s in v["slots"] if 1 + index in s["holder_bits"]]
    assert len(held) >= 3, "the victim holds %s" % held
    reaped = v["reaped"]
    os.kill(vpid, signal.SIGKILL)

    def gone():
        v = inspect(path)
        still = [s["index"] for s in v["slots"] if 1 + index in s["holder_bits"]]
        return v if v["reaped"] > reaped and not still and not any(
            k["index"] == index and k["state"] == "active" for k in v["consumers"]) else None
    wait_for("the killed consumer's slots given back", gone, timeout=10)

    # A consumer that follows producers: the first is killed, a second takes the name.
    follower = c.start(PIDNS + [PEER, "consume", path, "--reconnect", "--open-timeout-ms", "20000"])
    follower.wait_line("attached")
    time.sleep(0.3)
    os.kill(prod.inner_pid(), signal.SIGKILL)
    prod.finish()
    prod2 = c.start(PIDNS + [PEER, "produce", path, "--frames", "200", "--fps", "300", "--wait-consumers", "1",
                             "--drain"])
    assert prod2.finish() == 0, prod2.stderr()
    f = expect_bit_exact(follower)
    assert int(f["reconnects"]) >= 1 and f["eos"] == "1", f


# --- mount namespaces --------------------------------------------------------------

def case_mount_namespace(c):
    """A consumer whose mount namespace has only the socket's directory, bind-mounted at
    another path; the owner's own path to it hidden."""
    probe(unshare_prefix("--mount"), "mount namespaces")
    path = c.dir + "/mntns"
    mnt = tempfile.mkdtemp(prefix="xmem-mnt-")
    try:
        prod = c.start(PIDNS + [PEER, "produce", path, "--frames", "300", "--fps", "300", "--wait-consumers", "1",
                                "--policy", "block", "--drain"])
        script = ('set -e; mount -t tmpfs xmem-test "$1"; mkdir "$1/pools"; mount --bind "$2" "$1/pools"; '
                  'mount -t tmpfs xmem-test "$2"; test ! -e "$2/mntns"; exec "$3" consume "$1/pools/mntns"')
        cons = c.start(unshare_prefix("--mount", "--pid", "--fork", "--mount-proc") +
                       ["sh", "-c", script, "sh", mnt, c.dir, PEER])
        assert prod.finish() == 0, prod.stderr()
        expect_bit_exact(cons, 300)
    finally:
        os.rmdir(mnt)


# --- users, groups and user namespaces -----------------------------------------------

def case_refused_with_a_clear_error(c):
    """A consumer of another uid, not allowed by the mode: the error names the socket's
    owner, group and mode and the process's ids."""
    outsider = as_user(OUTSIDER_UID)
    path = c.dir + "/private"
    prod = c.start([PEER, "produce", path, "--frames", "1000000", "--fps", "100", "--no-eos"])
    prod.wait_line("ready")
    k = c.start(outsider + [PEER, "consume", path, "--open-timeout-ms", "0"])
    assert k.finish() == 4, (k.lines, k.stderr())
    err = k.stderr()
    for want in ("permission denied", "uid %d" % os.geteuid(), "mode 0600", "this process is uid %d" % OUTSIDER_UID):
        assert want in err, "refusal %r does not say %r" % (err, want)
    assert any(l.startswith("error=") for l in k.lines), k.lines


def group_owner(c, name, extra=()):
    owner = as_user(OWNER_UID, [GROUP])
    prod = c.start(owner + [PEER, "produce", name, "--frames", "1000000", "--fps", "300", "--no-eos",
                            "--mode", "0660", "--group", str(GROUP), *extra])
    prod.wait_line("ready")
    return prod


def case_group_access(c):
    """Mode 0660 and a shared group: a member of another uid attaches and reads every
    byte; an outsider is refused with the group and mode named."""
    member, outsider = as_user(MEMBER_UID, [GROUP]), as_user(OUTSIDER_UID)
    os.chown(c.dir, OWNER_UID, OWNER_UID)
    path = c.dir + "/shared"
    group_owner(c, path)
    st = os.stat(path)
    assert st.st_gid == GROUP and st.st_mode & 0o777 == 0o660, "socket gid %d mode %o" % (st.st_gid, st.st_mode)
    expect_bit_exact(c.start(member + [PEER, "consume", path, "--frames", "200"]), 200)
    k = c.start(outsider + [PEER, "consume", path, "--open-timeout-ms", "0"])
    assert k.finish() == 4, k.stderr()
    for want in ("permission denied", "group %d" % GROUP, "mode 0660", "this process is uid %d" % OUTSIDER_UID):
        assert want in k.stderr(), "refusal %r does not say %r" % (k.stderr(), want)


def case_user_namespace_consumer(c):
    """A consumer in a user namespace of its own (root inside, a plain uid outside): the
    owner sees it as the uid and groups it has on the host."""
    member, outsider = as_user(MEMBER_UID, [GROUP]), as_user(OUTSIDER_UID)
    probe(member + ["unshare", "--user", "--map-root-user"], "an unprivileged user namespace")
    os.chown(c.dir, OWNER_UID, OWNER_UID)
    path = c.dir + "/userns"
    group_owner(c, path)
    k = c.start(member + ["unshare", "--user", "--map-root-user", PEER, "consume", path, "--frames", "150"])
    expect_bit_exact(k, 150)
    k = c.start(outsider + ["unshare", "--user", "--map-root-user", PEER, "consume", path, "--open-timeout-ms", "0"])
    assert k.finish() == 4, k.stderr()
    assert "permission denied" in k.stderr() and "mode 0660" in k.stderr(), k.stderr()


def case_abstract_socket_credentials(c):
    """An abstract socket has no file mode: the owner's check of each peer's credentials
    is the whole access control, and says why it refuses."""
    member, outsider = as_user(MEMBER_UID, [GROUP]), as_user(OUTSIDER_UID)
    name = "@xmem-test-%d-abstract" % os.getpid()
    group_owner(c, name)
    expect_bit_exact(c.start(member + [PEER, "consume", name, "--frames", "200"]), 200)
    k = c.start(outsider + [PEER, "consume", name, "--open-timeout-ms", "0"])
    assert k.finish() == 4, k.stderr()
    want = "uid %d (gid %d) may not use this pool: mode 0660, owner uid %d, group %d" % (
        OUTSIDER_UID, OUTSIDER_UID, OWNER_UID, GROUP)
    assert want in k.stderr(), "refusal %r does not say %r" % (k.stderr(), want)
    # A second owner cannot take the name while the first lives.
    k = c.start([PEER, "produce", name, "--frames", "1"])
    assert k.finish() == 1 and "owned by a live process" in k.stderr(), k.stderr()


# --- network namespaces ---------------------------------------------------------------

def case_network_namespace_abstract(c):
    """An abstract socket is per network namespace: a consumer sharing the producer's
    reads every byte, one outside it is told there is no such socket in its own."""
    netns = unshare_prefix("--net", "--pid", "--fork", "--mount-proc", "--kill-child")
    probe(netns, "network namespaces")
    name = "@xmem-test-%d-netns" % os.getpid()
    prod = c.start(netns + [PEER, "produce", name, "--frames", "300", "--fps", "300", "--wait-consumers", "1",
                            "--policy", "block", "--drain"])
    ppid = prod.inner_pid()
    k = c.start([PEER, "consume", name, "--open-timeout-ms", "300"])
    assert k.finish() == 4, k.stderr()
    assert "no abstract socket of that name in this network namespace" in k.stderr(), k.stderr()
    enter = ["nsenter", "--target", str(ppid), "--net"] if ROOT else \
        ["nsenter", "--target", str(ppid), "--user", "--net", "--preserve-credentials"]
    cons = c.start(enter + [PEER, "consume", name])
    assert prod.finish() == 0, prod.stderr()
    expect_bit_exact(cons, 300)


# --- CUDA pools on the simulator ------------------------------------------------------

def cuda_env():
    if not CUDA_PEER or not CUDA_DRIVER:
        raise Skip("built without CUDA: no simulator")
    env = dict(os.environ)
    env["XMEM_CUDA_DRIVER"] = CUDA_DRIVER
    return env


def case_cuda_pid_namespaces(c):
    """A CUDA pool (simulated) across PID namespaces: every byte read back on the GPU
    side; a consumer SIGKILLed while reads of its frames are queued on its stream is
    quarantined until its process has exited, which the owner learns from the pidfd the
    consumer sent (SO_PEERCRED's pid is 0 across sibling namespaces), not after the 30 s
    grace period it would otherwise wait."""
    env = cuda_env()
    probe(PIDNS, "PID namespaces")
    path = c.dir + "/cuda"
    prod = c.start(PIDNS + [CUDA_PEER, "produce", path, "--frames", "1000000", "--fps", "200", "--drop",
                            "--slots", "6", "--linger-ms", "0"], env)
    prod.wait_line("ready")
    holder = c.start(PIDNS + [CUDA_PEER, "consume", path, "--hold", "2"], env)
    holder.wait_line("holding")
    holder.wait_line("holding", timeout=20)
    hpid = holder.inner_pid()
    v = inspect(path)
    rec = next(k for k in v["consumers"] if k["pid"] == hpid)
    assert rec["owner_seen_pid"] == 0 and rec["own_pid"] == 1, rec
    os.kill(hpid, signal.SIGKILL)
    killed = time.monotonic()

    def released():
        v = inspect(path)
        return not any(k["index"] == rec["index"] for k in v["consumers"])
    wait_for("the killed consumer's record freed", released, timeout=25, interval=0.1)
    took = time.monotonic() - killed
    assert took < 10, "the quarantine of a consumer in another PID namespace lasted %.1f s" % took
    print("  killed device-pool consumer released after %.2f s" % took)

    reader = c.start(PIDNS + [CUDA_PEER, "consume", path, "--frames", "100"], env)
    assert reader.finish(60) == 0, (reader.lines, reader.stderr())
    assert "frames=100 bad=0" in reader.lines, reader.lines


# --- GStreamer elements ---------------------------------------------------------------

def case_gst_abstract_across_pid_namespaces(c):
    """xmemsink and xmemsrc on an abstract pool name, each in its own PID namespace: the
    consumer's frames have the checksums the same source gives without xmem."""
    if not GST_LAUNCH:
        raise Skip("no gst-launch-1.0 or plugin")
    probe(PIDNS, "PID namespaces")
    src = "videotestsrc num-buffers=60 pattern=ball ! video/x-raw,format=I420,width=320,height=240,framerate=60/1"
    ref = subprocess.run([GST_LAUNCH, "-q"] + (src + " ! checksumsink").split(), capture_output=True, text=True,
                         timeout=60)
    if ref.returncode != 0 or "checksumsink" in ref.stderr:
        raise Skip("no checksumsink (gst-plugins-bad): %s" % ref.stderr.strip())
    name = "@xmem-test-%d-gst" % os.getpid()
    env = dict(os.environ)
    if os.environ.get("XMEM_GST_PRELOAD"):  # a sanitizer build's plugin in a plain gst-launch-1.0
        env["LD_PRELOAD"] = os.environ["XMEM_GST_PRELOAD"]
        # gst-launch-1.0's own leaks are not ours (as tests/hostile has it); and as pid 1
        # of its namespace, LeakSanitizer's stop-the-world at exit never returned (the
        # sink hung past its 60 frames in CI's AddressSanitizer stage).
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    # Every frame must arrive: policy=block with a long block-timeout. The default,
    # drop-oldest, drops frames a slow consumer has not taken yet, as it should; in CI's
    # AddressSanitizer stage xmemsrc lost frame 1 that way while its streaming thread
    # started.
    sink = c.start(PIDNS + [GST_LAUNCH, "-q"] +
                   (src + " ! xmemsink pool-name=%s wait-for-consumers=1 policy=block block-timeout=%d" %
                    (name, 30 * 10**9)).split(), env)
    src_proc = c.start(PIDNS + [GST_LAUNCH, "-q"] + ("xmemsrc pool-name=%s ! checksumsink" % name).split(), env)
    assert sink.finish(60) == 0, sink.stderr()
    assert src_proc.finish(60) == 0, src_proc.stderr()
    want = [l.split()[-1] for l in ref.stdout.splitlines() if l.strip()]
    got = [l.split()[-1] for l in src_proc.lines if l.strip()]
    assert got == want, "%d frames through xmem, %d from the source; first differing %s" % (
        len(got), len(want), next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None))


CASES = [
    case_pid_namespaces,
    case_pid_namespace_kills,
    case_mount_namespace,
    case_refused_with_a_clear_error,
    case_group_access,
    case_user_namespace_consumer,
    case_abstract_socket_credentials,
    case_network_namespace_abstract,
    case_cuda_pid_namespaces,
    case_gst_abstract_across_pid_namespaces,
]


def main():
    only = sys.argv[1:]
    if not shutil.which("unshare") or not shutil.which("nsenter"):
        print("SKIP: util-linux's unshare and nsenter are needed")
        return 77
    passed, skipped, failed = [], [], []
    for case in CASES:
        name = case.__name__[len("case_"):]
        if only and name not in only:
            continue
        d = tempfile.mkdtemp(prefix="xmem-ct-")
        os.chmod(d, 0o755)
        c = Case(d)
        start = time.monotonic()
        try:
            case(c)
            passed.append(name)
            print("ok   %s (%.1f s)" % (name, time.monotonic() - start), flush=True)
        except Skip as e:
            skipped.append(name)
            print("SKIP %s: %s" % (name, e), flush=True)
        except Exception:
            failed.append(name)
            print("FAIL %s:\n%s" % (name, traceback.format_exc()), flush=True)
        finally:
            c.close()
            shutil.rmtree(d, ignore_errors=True)
    print("%d passed, %d skipped, %d failed" % (len(passed), len(skipped), len(failed)))
    if failed:
        return 1
    return 77 if not passed else 0


if __name__ == "__main__":
    sys.exit(main())

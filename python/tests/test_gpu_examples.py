"""test_gpu_examples.py - examples/python/onnx_cuda.py (ONNX Runtime's CUDA provider) and
torch_stream.py (torch on a stream of its own) run end to end against a torch producer
in another process writing a known pattern into a CUDA pool: every frame's per-channel
means are the pattern's, and the address each framework read is the slot's. Skipped
without a GPU (or with the CUDA simulator loaded: it proves xmem's logic, these prove
the driver's and the frameworks'), and without onnxruntime's CUDA provider for
onnx_cuda.py; the model file the example falls back on is checked wherever onnx and
onnxruntime are installed."""

import os
import subprocess
import sys
import textwrap
import uuid

import numpy
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python")
FRAMES = 60
HEIGHT, WIDTH, CHANNELS = 270, 480, 4
SKIPPED = 77  # an example's exit status when a tool it needs is missing


def real_gpu():
    if "cudasim" in os.environ.get("XMEM_CUDA_DRIVER", ""):
        pytest.skip("the CUDA simulator is loaded: these tests are for the real driver")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch %s" % torch.__version__)
    return torch


def pattern(n):
    """Frame N as numpy computes it: the producer below writes the same with torch.
    Each channel's mean grows by one a frame, and no value wraps at 256, so a frame
    read before its writes landed (the slot's frame N - 4, or nothing) shows."""
    ys = numpy.arange(HEIGHT).reshape(HEIGHT, 1, 1)
    xs = numpy.arange(WIDTH).reshape(1, WIDTH, 1)
    cs = numpy.arange(CHANNELS).reshape(1, 1, CHANNELS)
    frame = (xs + 2 * ys) % 32 + 48 * cs + n
    assert frame.max() < 256, "the pattern wraps: fewer frames or channels"
    return frame.astype(numpy.uint8)


# Waits for a consumer, then publishes FRAMES frames of pattern(n) as (h, w, c) uint8
# tensors, each written by a kernel on its own stream and published on it; then waits
# for a line on stdin (the test's: the consumer is done) before closing the pool.
PRODUCER = textwrap.dedent("""
    import sys, time, torch, xmem
    pool, frames, height, width, channels = sys.argv[1], *map(int, sys.argv[2:6])
    size = height * width * channels
    stream = torch.cuda.Stream()
    ys = torch.arange(height, device="cuda").view(height, 1, 1)
    xs = torch.arange(width, device="cuda").view(1, width, 1)
    cs = torch.arange(channels, device="cuda").view(1, 1, channels)
    base = (xs + 2 * ys) % 32 + 48 * cs
    stream.wait_stream(torch.cuda.current_stream())  # base was made on the default stream
    with xmem.create(pool, size, slots=4, storage="cuda", policy="block") as p:
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while p.stats()["consumers"] == 0:
            if time.monotonic() > deadline:
                sys.exit("producer: no consumer attached in 60 s")
            time.sleep(0.01)
        for n in range(1, frames + 1):
            w = p.acquire(timeout=120, stream=stream)  # the consumer's first frame waits for its setup
            with torch.cuda.stream(stream):
                slot = torch.from_dlpack(w)
                slot[:size].copy_((base + n).to(torch.uint8).view(-1))
            p.publish(w, stream=stream, dtype="uint8", shape=(height, width, channels))
            del slot, w
        p.end_of_stream()
        stream.synchronize()
        print("done", flush=True)
        sys.stdin.readline()
""")


def run_example(script):
    """SCRIPT run on a pool the producer fills; its completed process (the producer
    checked). Skips when the example exits 77, with its reason."""
    pool = "gpu-" + uuid.uuid4().hex[:8]
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, pool, str(FRAMES), str(HEIGHT), str(WIDTH),
                                 str(CHANNELS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert producer.stdout.readline().strip() == "ready"
        run = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), pool, "--timeout", "60"],
                             capture_output=True, text=True, timeout=300)
        if run.returncode == SKIPPED:
            pytest.skip((run.stderr.strip().splitlines() or ["%s exited %d" % (script, SKIPPED)])[-1])
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        out, _ = producer.communicate("close\n", timeout=60)
        assert producer.returncode == 0 and out.strip() == "done", (producer.returncode, out)
    finally:
        producer.kill()
        producer.wait()
    return run


def check_frames(run, prefix, bound):
    """PREFIX's lines: "PREFIX: frame SEQ means M.. BOUND 0x.. slot 0x.. zero-copy", one a
    frame in order, each with pattern(n)'s means and the slot's address as BOUND's."""
    lines = [line.split() for line in run.stdout.splitlines() if line.startswith(prefix + ": frame ")]
    assert len(lines) == FRAMES, run.stdout[-3000:] + run.stderr[-3000:]
    seqs = [int(words[2]) for words in lines]
    assert seqs == list(range(seqs[0], seqs[0] + FRAMES)), seqs
    wrong = []
    for n, words in enumerate(lines, start=1):
        means = [float(v) for v in words[4:4 + CHANNELS]]
        expected = pattern(n).mean(axis=(0, 1))
        if not numpy.allclose(means, expected, rtol=0, atol=0.01):
            wrong.append((n, means, expected.tolist()))
        rest = words[4 + CHANNELS:]
        assert words[3] == "means" and rest[0] == bound and rest[2] == "slot", words
        assert rest[1] == rest[3] and rest[4] == "zero-copy", "%s did not read the slot itself: %s" % (prefix, words)
    assert not wrong, "frames whose means are not the producer's: %s" % wrong[:5]


def test_onnx_runtime_reads_each_device_slot_in_place_with_the_cuda_provider_on_a_gpu():
    real_gpu()
    onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip: onnxruntime-gpu)")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime %s has no CUDAExecutionProvider (it has %s): pip's onnxruntime-gpu has it"
                    % (onnxruntime.__version__, ", ".join(onnxruntime.get_available_providers())))
    run = run_example("onnx_cuda.py")
    check_frames(run, "onnx_cuda", "input")
    summary = [line for line in run.stdout.splitlines() if line.startswith("onnx_cuda: %d frames on cuda:" % FRAMES)]
    assert summary and "CUDAExecutionProvider" in summary[0], run.stdout[-1000:]


def test_torch_reads_each_device_slot_in_place_on_its_own_stream_on_a_gpu():
    real_gpu()
    run = run_example("torch_stream.py")
    check_frames(run, "torch_stream", "tensor")
    assert "torch_stream: %d frames on cuda:" % FRAMES in run.stdout, run.stdout[-1000:]


def test_the_checked_in_model_is_what_make_mean_model_builds_and_gives_channel_means():
    """onnx_cuda.py falls back on channel_mean.onnx where onnx is not installed: it must
    be the model make_mean_model.py builds, and compute each channel's mean."""
    onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (Debian 13: "
                                      "python3-onnxruntime)")
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (Debian 13: python3-onnx)")
    sys.path.insert(0, EXAMPLES)
    try:
        import make_mean_model
    finally:
        sys.path.remove(EXAMPLES)
    with open(make_mean_model.MODEL_FILE, "rb") as f:
        stored = f.read()
    assert onnx.load_model_from_string(stored) == onnx.load_model_from_string(make_mean_model.channel_mean_model()), \
        "channel_mean.onnx is stale: run examples/python/make_mean_model.py"
    session = onnxruntime.InferenceSession(stored, providers=["CPUExecutionProvider"])
    frame = pattern(7)
    means = session.run(None, {"frame": frame})[0]
    assert numpy.allclose(means, frame.mean(axis=(0, 1)), rtol=0, atol=0.01), (means, frame.mean(axis=(0, 1)))

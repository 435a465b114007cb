#!/usr/bin/env python3
"""onnx_cuda.py POOL [--frames N] - ONNX Runtime on the GPU, reading each frame of a
CUDA device pool in place.

Attaches to POOL (CUDA device memory, frames published as (height, width, channels)
uint8 tensors, e.g. by a torch producer's ``publish(w, dtype="uint8", shape=(h, w, c))``)
and runs an ONNX model on each frame with the CUDA execution provider through I/O
binding, the slot's own device address as the model's input:
``bind_input(..., device_type="cuda", buffer_ptr=frame.cuda_ptr)``. ONNX Runtime reads
the slot where it is: nothing is copied, to the host or on the device, and no node may
fall back to the CPU (session.disable_cpu_ep_fallback), which would copy the frame to
host memory first. The model, the mean of each channel as float32, is built with the
onnx package where it is installed, else read from channel_mean.onnx beside this file
(make_mean_model.py wrote it). For each frame it prints the means and the address ONNX
Runtime was given beside the slot's; right means show that ONNX Runtime read the slot:

    onnx_cuda: frame SEQ means M0 M1 .. input 0xADDRESS slot 0xADDRESS zero-copy

Ordering: ONNX Runtime's Python API does not hand out the CUDA stream it runs on, so a
frame is received without a stream: receive() waits on the CPU for the producer's
writes, and the frame is then ready for any stream, ONNX Runtime's included. Each run
ends with ONNX Runtime's stream synchronized (disable_synchronize_execution_providers=0,
its default, set here so that it stays so), and the slot is released after that, once
ONNX Runtime's reads of it are done. A program that gives ONNX Runtime a stream of its
own (the CUDA provider's user_compute_stream option) could receive(stream=...) and
release on that stream instead, with no CPU wait.

Needs onnxruntime with the CUDA execution provider (pip's onnxruntime-gpu); without it,
or when it does not load, says why and exits 77, which python/tests/test_gpu_examples.py
takes as "skipped".

    python3 examples/python/onnx_cuda.py cam0 --frames 100
"""

import argparse
import os
import sys

import numpy

try:
    import onnxruntime
except ImportError as e:
    sys.exit("onnx_cuda.py: needs onnxruntime with the CUDA execution provider (pip's onnxruntime-gpu): %s" % e)

import xmem

CUDA = "CUDAExecutionProvider"
NO_CUDA_PROVIDER = 77  # the exit status of a test whose hardware or tools are missing
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "channel_mean.onnx")


def no_cuda_provider(why):
    print("onnx_cuda.py: %s" % why, file=sys.stderr)
    sys.exit(NO_CUDA_PROVIDER)


def channel_mean_model():
    """The model's bytes, and where they came from."""
    try:
        import make_mean_model  # beside this file; imports onnx
    except ImportError:  # no onnx package: pip's onnxruntime-gpu comes without it
        with open(MODEL_FILE, "rb") as f:
            return f.read(), os.path.basename(MODEL_FILE)
    return make_mean_model.channel_mean_model(), "built with onnx " + make_mean_model.onnx.__version__


def cuda_session(model, device):
    """A session of MODEL whose every node runs on CUDA device DEVICE."""
    if hasattr(onnxruntime, "preload_dlls"):
        # onnxruntime-gpu 1.21 and later: CUDA and cuDNN from the nvidia-* wheels where
        # they are installed (torch brings them), which the provider needs to load;
        # where they are not, it says so and the libraries' usual places are searched.
        try:
            onnxruntime.preload_dlls()
        except Exception as e:
            print("onnx_cuda.py: preload_dlls: %s" % e, file=sys.stderr)
    providers = [(CUDA, {"device_id": device})]
    # A provider that fails to load (missing CUDA or cuDNN libraries) leaves a session
    # on the CPU, with ONNX Runtime's warning above saying why, or raises (CUDA_PATH set).
    try:
        loaded = onnxruntime.InferenceSession(model, providers=providers).get_providers()
    except Exception as e:  # onnxruntime's own exception types vary between versions
        no_cuda_provider("the CUDA execution provider of onnxruntime %s did not load: %s"
                         % (onnxruntime.__version__, e))
    if CUDA not in loaded:
        no_cuda_provider("the CUDA execution provider of onnxruntime %s did not load (see its warning)"
                         % onnxruntime.__version__)
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return onnxruntime.InferenceSession(model, options, providers=providers)


def dense_shape(frame):
    """FRAME's (height, width, channels), which must be a dense uint8 tensor: a bound
    buffer has no strides."""
    m = frame.meta
    if m.dtype != "uint8" or len(m.shape) != 3:
        sys.exit("onnx_cuda.py: frame %d is a %s tensor of shape %s, not (height, width, channels) uint8"
                 % (m.seq, m.dtype, m.shape))
    height, width, channels = m.shape
    if m.strides != (width * channels, channels, 1):
        sys.exit("onnx_cuda.py: frame %d has strides %s: ONNX Runtime binds dense tensors" % (m.seq, m.strides))
    return m.shape


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: until EOS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the pool and each frame")
    args = parser.parse_args()

    if CUDA not in onnxruntime.get_available_providers():
        no_cuda_provider("onnxruntime %s has no CUDA execution provider (it has %s): pip's onnxruntime-gpu has it"
                         % (onnxruntime.__version__, ", ".join(onnxruntime.get_available_providers())))
    consumer = xmem.open(args.pool, timeout=args.timeout)
    if consumer.storage != "cuda":
        sys.exit("onnx_cuda.py: pool %s is in %s memory, not CUDA device memory (onnx_infer.py reads that)"
                 % (args.pool, consumer.storage))
    device = consumer.classes()[0]["device"]
    model, origin = channel_mean_model()
    session = cuda_session(model, device)
    run_options = onnxruntime.RunOptions()
    run_options.add_run_config_entry("disable_synchronize_execution_providers", "0")
    count = 0
    while not args.frames or count < args.frames:
        try:
            frame = consumer.receive(timeout=args.timeout)  # the CPU waited for the producer's writes
        except xmem.EndOfStream:
            break
        with frame:
            if frame.meta.device != device:
                sys.exit("onnx_cuda.py: frame %d is on CUDA device %d, the session on %d"
                         % (frame.meta.seq, frame.meta.device, device))
            shape = dense_shape(frame)
            address = frame.cuda_ptr  # valid while the frame is held: until the with block ends
            binding = session.io_binding()
            binding.bind_input("frame", device_type="cuda", device_id=device, element_type=numpy.uint8,
                               shape=shape, buffer_ptr=address)
            binding.bind_output("means", device_type="cuda", device_id=device)
            session.run_with_iobinding(binding, run_options)  # returns with ORT's stream done
            means = binding.copy_outputs_to_cpu()[0]
            slot = frame.cuda_ptr
            del binding
        # The slot is back (the with block released it), after ONNX Runtime's reads.
        count += 1
        print("onnx_cuda: frame %d means %s input 0x%x slot 0x%x %s" % (
            frame.meta.seq, " ".join("%.3f" % m for m in means), address, slot,
            "zero-copy" if address == slot else "COPIED"), flush=True)
    consumer.close()
    if not count:
        sys.exit("onnx_cuda.py: no frame received")
    print("onnx_cuda: %d frames on cuda:%d, providers %s, onnxruntime %s, model %s" % (
        count, device, ",".join(session.get_providers()), onnxruntime.__version__, origin))


if __name__ == "__main__":
    main()

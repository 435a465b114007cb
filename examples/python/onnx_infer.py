#!/usr/bin/env python3
"""onnx_infer.py POOL [--frames N] - ONNX Runtime on the frames of an xmem pool.

Attaches to POOL (packed RGBA or BGRA video in system memory, e.g. from
``videotestsrc ! video/x-raw,format=RGBA ! xmemsink pool-name=POOL``) and runs an ONNX
model on each frame through ONNX Runtime's I/O binding, with the frame's own buffer
as the model's input: ``bind_input(..., buffer_ptr=<the slot's address>)``, so ONNX
Runtime reads the shared slot itself and nothing is copied on the CPU. The model is
made here with the onnx package (nothing is downloaded): the mean of each channel, as
float32. For each frame it prints the means and the bound address beside the slot's:

    onnx: frame 3 means 51.00 102.00 153.00 255.00 input 0x7f.. slot 0x7f.. zero-copy

A frame whose rows are padded (not contiguous) cannot be bound as it is: it is copied
once into a contiguous array, and the line says "copied". Debian 13 has the packages
(python3-onnxruntime, python3-onnx); Debian 12 has neither.

    python3 examples/python/onnx_infer.py cam0 --frames 100
"""

import argparse
import sys

import numpy

try:
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper
except ImportError as e:  # Debian 12: not packaged
    sys.exit("onnx_infer.py: needs onnx and onnxruntime (Debian 13: python3-onnx python3-onnxruntime): %s" % e)

import xmem


def channel_means_model(height, width, channels):
    """A graph taking a (H, W, C) uint8 frame and giving its C channel means (float32)."""
    frame = helper.make_tensor_value_info("frame", TensorProto.UINT8, [height, width, channels])
    means = helper.make_tensor_value_info("means", TensorProto.FLOAT, [channels])
    nodes = [
        helper.make_node("Cast", ["frame"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["as_float"], ["means"], axes=[0, 1], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "channel_means", [frame], [means])
    # Opset 13: ReduceMean's axes are an attribute there (an input from 18).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pool")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: until EOS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the pool and each frame")
    args = parser.parse_args()

    consumer = xmem.open(args.pool, timeout=args.timeout)
    sessions = {}
    count = copied = 0
    while not args.frames or count < args.frames:
        try:
            frame = consumer.receive(timeout=args.timeout)
        except xmem.EndOfStream:
            break
        with frame:
            fmt, width, height = xmem._video_format(frame.meta.format)
            if fmt not in ("RGBA", "BGRA", "RGBx", "BGRx"):
                sys.exit("onnx_infer.py: pool publishes %s, not a packed 4-channel format" % fmt)
            pixels = frame.planes()[0]  # (h, w, 4), a read-only view of the slot
            slot = pixels.__array_interface__["data"][0]
            if pixels.strides != (width * 4, 4, 1):
                pixels = numpy.ascontiguousarray(pixels)  # padded rows: one copy
                copied += 1
            shape = pixels.shape
            if shape not in sessions:
                sessions[shape] = onnxruntime.InferenceSession(channel_means_model(*shape),
                                                               providers=["CPUExecutionProvider"])
            session = sessions[shape]
            binding = session.io_binding()
            address = pixels.__array_interface__["data"][0]
            binding.bind_input("frame", device_type="cpu", device_id=0, element_type=numpy.uint8,
                               shape=shape, buffer_ptr=address)
            binding.bind_output("means", device_type="cpu")
            session.run_with_iobinding(binding)
            means = binding.copy_outputs_to_cpu()[0]
            del pixels
        count += 1
        print("onnx: frame %d means %s input 0x%x slot 0x%x %s" % (
            frame.meta.seq, " ".join("%.2f" % m for m in means), address, slot,
            "zero-copy" if address == slot else "copied"), flush=True)
    consumer.close()
    if not count:
        sys.exit("onnx_infer.py: no frame received")
    print("onnx_infer: %d frames, %d copied, onnxruntime %s" % (count, copied, onnxruntime.__version__))


if __name__ == "__main__":
    main()

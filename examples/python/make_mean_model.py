#!/usr/bin/env python3
"""make_mean_model.py [OUTPUT] - writes the ONNX model that onnx_cuda.py runs: the mean
of each channel of a (height, width, channels) uint8 frame, as float32.

The model is built here with the onnx package (nothing is downloaded). onnx_cuda.py
builds it the same way where onnx is installed; elsewhere (pip's onnxruntime-gpu comes
without onnx) it reads channel_mean.onnx, beside this file, which was written in the
Debian 13 root (python3-onnx 1.17) by

    python3 examples/python/make_mean_model.py

python/tests/test_gpu_examples.py checks that the file is still what this script builds.
"""

import argparse
import os

import onnx
from onnx import TensorProto, helper

MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "channel_mean.onnx")


def channel_mean_model():
    """The serialized model: "frame" (height, width, channels) uint8 in, "means"
    (channels) float32 out. Its dimensions are named, not fixed, so one model (and one
    ONNX Runtime session) takes frames of every size."""
    frame = helper.make_tensor_value_info("frame", TensorProto.UINT8, ["height", "width", "channels"])
    means = helper.make_tensor_value_info("means", TensorProto.FLOAT, ["channels"])
    # The sums are taken in float64: in float32 a 1080p frame's pass 2**24, past which
    # each addition rounds (ONNX Runtime's CPU provider is off by 0.1 on 270x480).
    nodes = [
        helper.make_node("Cast", ["frame"], ["as_double"], to=TensorProto.DOUBLE),
        helper.make_node("ReduceMean", ["as_double"], ["double_means"], axes=[0, 1], keepdims=0),
        helper.make_node("Cast", ["double_means"], ["means"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "channel_mean", [frame], [means])
    # Opset 13 (ReduceMean's axes are an attribute there, an input from 18) and IR
    # version 8: what every ONNX Runtime from 1.10 on reads.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", default=MODEL_FILE, help="where to write it (default: %(default)s)")
    args = parser.parse_args()
    model = channel_mean_model()
    with open(args.output, "wb") as f:
        f.write(model)
    print("make_mean_model: %d bytes to %s (onnx %s)" % (len(model), args.output, onnx.__version__))


if __name__ == "__main__":
    main()

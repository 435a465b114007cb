"""test_gst_pipeline.py - GStreamer's own CUDA elements through the cudacount shim: nvcodec
opens "libcuda.so.1" by name and gets the shim, which forwards to the driver behind it.
Ten NV12 frames go up with cudaupload and come back with cudadownload, so gst-launch-1.0's
line must count at least ten frame-sized copies each way. On the CUDA driver simulator
(cudacount-gst-sim) it proves the counting in a real pipeline, not a GPU's behaviour; on
the driver the shim finds (cudacount-gst-gpu) it runs on the GPU.

The environment (meson test sets it): CUDACOUNT_DIR (the shim's folder), GST_LAUNCH and
GST_INSPECT; on the simulator also XMEM_CUDACOUNT_DRIVER (the simulator) and CUDASIM_DIR
(its folder, which also holds the NVDEC stub nvcodec needs before it registers anything).
Exit status 77 (skipped) where nvcodec has no cudaupload.
"""

import json
import os
import subprocess
import sys
import tempfile

FRAMES = 10
WIDTH, HEIGHT = 320, 240


def main():
    env = dict(os.environ)
    for name in ("CUDACOUNT_DIR", "GST_LAUNCH", "GST_INSPECT"):
        if not env.get(name):
            print(f"{name} is not set (meson test sets it)")
            return 77
    with tempfile.TemporaryDirectory(prefix="cudacount-gst-") as tmp:
        # The shim first, as "libcuda.so.1"; the simulator's folder for libnvcuvid.so.1.
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (env["CUDACOUNT_DIR"], env.get("CUDASIM_DIR"), env.get("LD_LIBRARY_PATH")) if p)
        # A registry of its own: nvcodec registers its elements only when a driver loads.
        env["GST_REGISTRY"] = os.path.join(tmp, "registry.bin")
        env.pop("XMEM_CUDACOUNT_OUT", None)
        env.pop("XMEM_CUDACOUNT_MIN_BYTES", None)
        inspect = subprocess.run([env["GST_INSPECT"], "cudaupload"],
                                 env=env, capture_output=True, text=True, timeout=120)
        if inspect.returncode != 0:
            print("nvcodec's cudaupload is not available through the shim (no driver behind it, "
                  "or no gstreamer1.0-plugins-bad):\n" + inspect.stdout + inspect.stderr)
            return 77

        out = os.path.join(tmp, "counts.jsonl")
        env["XMEM_CUDACOUNT_OUT"] = out
        pipeline = (f"videotestsrc num-buffers={FRAMES} ! "
                    f"video/x-raw,format=NV12,width={WIDTH},height={HEIGHT} ! "
                    "cudaupload ! video/x-raw(memory:CUDAMemory) ! cudadownload ! video/x-raw ! fakesink")
        launch = subprocess.Popen([env["GST_LAUNCH"], "-q"] + pipeline.split(),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, _ = launch.communicate(timeout=240)
        if launch.returncode != 0:
            print(f"gst-launch-1.0 failed ({launch.returncode}):\n{output}")
            return 1
        with open(out) as f:
            lines = [json.loads(line) for line in f]
    for line in lines:
        print(json.dumps(line))
    mine = [line for line in lines if line["pid"] == launch.pid]
    if len(mine) != 1:
        print(f"expected one line of gst-launch-1.0 (pid {launch.pid}), got {len(mine)}")
        return 1
    counts = mine[0]
    failures = []
    expected_driver = os.environ.get("XMEM_CUDACOUNT_DRIVER")
    if counts["driver"] is None or (expected_driver and counts["driver"] != expected_driver):
        failures.append(f"driver {counts['driver']}, not {expected_driver or 'a driver'}")
    if counts["at"] != "exit":
        failures.append(f"written at {counts['at']}, not at exit")
    for direction in ("HtoD", "DtoH"):
        calls = counts["copies"][direction]["frame"]["calls"]
        if calls < FRAMES:
            failures.append(f"{calls} frame-sized {direction} copies for {FRAMES} frames")
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The flags a browser that trains is launched with (`andrea train`, the e2e tests, the
benches): quiet on a closed network, then SwiftShader or the machine's GPU, then
ANDREA_CHROMIUM_ARGS, with every Dawn toggle in one --enable-dawn-features."""

from __future__ import annotations

import os
import shlex

from andrea.run_config import MIXED_DAWN_TOGGLES

QUIET = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SWIFTSHADER = ["--enable-unsafe-webgpu", "--enable-unsafe-swiftshader",
               "--use-webgpu-adapter=swiftshader"]
# The machine's GPU through Vulkan. Without --enable-gpu and ANGLE on Vulkan, headless Chromium
# on a Linux server with no display (an H200 with /dev/nvidia* and no /dev/dri) offers no
# adapter at all. The crash limit is lifted so that a GPU process that crashes comes back every
# time: `andrea train` resumes the run (a bounded number of times), never a software fallback.
# The Dawn toggles that mixed precision needs on NVIDIA (run_config.MIXED_DAWN_TOGGLES).
GPU = ["--enable-unsafe-webgpu", "--ignore-gpu-blocklist", "--disable-gpu-sandbox", "--enable-gpu",
       "--use-angle=vulkan", "--enable-features=Vulkan,VulkanFromANGLE,DefaultANGLEVulkan",
       "--disable-gpu-process-crash-limit",
       "--enable-dawn-features=" + ",".join(MIXED_DAWN_TOGGLES)]


def extra_args() -> list[str]:
    """ANDREA_CHROMIUM_ARGS: more browser flags, as a shell would split them (for instance
    --enable-dawn-features=dump_shaders)."""
    return shlex.split(os.environ.get("ANDREA_CHROMIUM_ARGS", ""))


DAWN_FEATURES = "--enable-dawn-features="


def merge_dawn_features(args: list[str]) -> list[str]:
    """`args` with every --enable-dawn-features= flag folded into one, at the first one's place:
    Chromium reads only the last of a repeated switch, so toggles given in ANDREA_CHROMIUM_ARGS
    would otherwise drop those the mode needs (GPU's MIXED_DAWN_TOGGLES)."""
    toggles = [t for a in args if a.startswith(DAWN_FEATURES)
               for t in a[len(DAWN_FEATURES):].split(",") if t]
    merged = DAWN_FEATURES + ",".join(dict.fromkeys(toggles))
    out, placed = [], False
    for a in args:
        if not a.startswith(DAWN_FEATURES):
            out.append(a)
        elif not placed:
            out.append(merged)
            placed = True
    return out


def webgpu_args(gpu: bool) -> list[str]:
    """Every flag a browser that trains is launched with."""
    return merge_dawn_features(["--headless=new", *QUIET, *(GPU if gpu else SWIFTSHADER),
                                *extra_args()])

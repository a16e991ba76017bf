"""Which GPU backend this machine can use, found without llama.cpp: `python -m edgespec.runtime.gpuprobe`
prints `vulkan`, `cuda` or nothing (the set-up's EDGESPEC_GPU=auto builds that module).

* CUDA: an NVIDIA driver that lists a GPU (`nvidia-smi -L`) and a CUDA compiler (nvcc on PATH or in
  /usr/local/cuda) to build the module with.
* Vulkan: the Vulkan loader (libvulkan.so.1) enumerates a physical device that is not a CPU (Mesa's
  lavapipe is one; a machine with only that has no GPU), and glslc is there to compile the shaders.

Both checks take well under a second, so a machine with neither spends no time on a GPU build.
CUDA wins where both are there (its kernels are faster on NVIDIA GPUs than Vulkan's).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

# VkPhysicalDeviceType
VK_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
VK_CPU = 4


def nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in [Path("/usr/local/cuda/bin/nvcc")] if p.is_file()), None)


def nvidia_gpus() -> list[str]:
    """The GPUs NVIDIA's driver lists ('GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)'), [] without a driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in res.stdout.splitlines() if ln.startswith("GPU ")] if res.returncode == 0 else []


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def vulkan_devices() -> list[tuple[str, str]]:
    """(name, type) of each physical device the Vulkan loader finds; [] without a loader or driver."""
    try:
        vk = ctypes.CDLL("libvulkan.so.1" if sys.platform != "win32" else "vulkan-1.dll")
    except OSError:
        return []
    app = _AppInfo(0, None, b"edgespec-probe", 1, None, 0, (1 << 22) | (2 << 12))  # VK_API_VERSION_1_2
    info = _InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        if vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles) not in (0, 5):  # VK_INCOMPLETE
            return []
        out = []
        for h in handles[: count.value]:
            # VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType, deviceName[256], ...
            props = ctypes.create_string_buffer(4096)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(h), props)
            kind = int.from_bytes(props.raw[16:20], "little")
            name = props.raw[20:276].split(b"\0")[0].decode("utf-8", "replace")
            out.append((name, VK_TYPES.get(kind, str(kind))))
        return out
    finally:
        vk.vkDestroyInstance(instance, None)


def wanted() -> str:
    """'cuda', 'vulkan' or '' for this machine (module docstring)."""
    if nvidia_gpus() and nvcc():
        return "cuda"
    gpus = [name for name, kind in vulkan_devices() if kind != VK_TYPES[VK_CPU]]
    if gpus and shutil.which("glslc"):
        return "vulkan"
    if gpus:
        print(f"[setup] a Vulkan GPU is here ({gpus[0]}) but no glslc to build the Vulkan module: install the "
              "Vulkan SDK (Debian/Ubuntu: glslc libvulkan-dev spirv-headers) and re-run; models run on the CPU",
              file=sys.stderr)
    return ""


if __name__ == "__main__":
    print(wanted())

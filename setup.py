"""Build of the native extension ``fastload._C``; all metadata lives in pyproject.toml.

Environment variables:
  FASTLOAD_SANITIZE=address,undefined   build with -fsanitize=... -fno-omit-frame-pointer -O1 -g
  FASTLOAD_JPEG_PREFIX=/opt/jpeg        look for include/jpeglib.h and lib/libjpeg there too
  FASTLOAD_BUILD_JOBS=N                 compile N sources at once (default: one per core)
"""

import os
import re
import shutil
import sys
import tempfile

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, ExecError, LinkError

SOURCES = [
    "csrc/binding.cc",
    "csrc/bind_augment.cc",
    "csrc/bind_convert.cc",
    "csrc/bind_decode.cc",
    "csrc/bind_gather.cc",
    "csrc/bind_mask.cc",
    "csrc/mask.cc",
    "csrc/augment.cc",
    "csrc/pil_enhance.cc",
    "csrc/batch.cc",
    "csrc/convert.cc",
    "csrc/gather.cc",
    "csrc/jpeg.cc",
    "csrc/pool.cc",
    "csrc/resize.cc",
    "csrc/augment_plan.cc",
    "csrc/warp.cc",
]

INSTALL_COMPILER = (
    "Install a C++17 compiler: Debian/Ubuntu `apt-get install g++`, "
    "Fedora `dnf install gcc-c++`, macOS `xcode-select --install`."
)
INSTALL_JPEG = (
    "Install the libjpeg-turbo development files: Debian `apt-get install libjpeg62-turbo-dev`, "
    "Ubuntu `apt-get install libjpeg-turbo8-dev`, Fedora `dnf install libjpeg-turbo-devel`, "
    "macOS `brew install jpeg-turbo`; or point FASTLOAD_JPEG_PREFIX at its install prefix."
)

INSTALL_PNG = (
    "Install the libpng development files (mask fields decode PNG): Debian/Ubuntu `apt-get install libpng-dev`, "
    "Fedora `dnf install libpng-devel`, macOS `brew install libpng`."
)

PROBE_CXX = "#include <vector>\nint main() { std::vector<int> v{1}; return v[0] - 1; }\n"
PROBE_PNG = """#include <png.h>
int main() {  // libpng >= 1.6: the simplified png_image API
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  return png_image_begin_read_from_memory(&image, "", 0) != 0;
}
"""
PROBE_JPEG = """#include <cstdio>
#include <jpeglib.h>
int main() {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_decompress(&cinfo);
  // libjpeg-turbo >= 1.5 API used by fastload:
  void* use[] = {(void*)&jpeg_crop_scanline, (void*)&jpeg_skip_scanlines, (void*)&jpeg_mem_src};
  jpeg_destroy_decompress(&cinfo);
  return use[0] == nullptr;
}
"""


def _flags():
    compile_args = ["-fvisibility=hidden", "-pthread"]
    link_args = ["-pthread"]
    sanitize = os.environ.get("FASTLOAD_SANITIZE", "").strip()
    if sanitize:
        if not re.fullmatch(r"[a-z_-]+(,[a-z_-]+)*", sanitize):
            sys.exit(f"FASTLOAD_SANITIZE={sanitize!r} should look like 'address,undefined'")
        san = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
        compile_args += san + ["-O1", "-g"]
        link_args += san
    else:
        compile_args += ["-O3"]
    return compile_args, link_args


def _jpeg_dirs():
    prefix = os.environ.get("FASTLOAD_JPEG_PREFIX")
    if not prefix:
        return [], []
    libs = [os.path.join(prefix, d) for d in ("lib", "lib64") if os.path.isdir(os.path.join(prefix, d))]
    return [os.path.join(prefix, "include")], libs


class BuildExt(build_ext):
    """Checks the compiler, libjpeg-turbo and libpng up front, with an install hint instead of a wall of
    compiler errors."""

    def build_extensions(self):
        self._probe("a C++17 compiler", PROBE_CXX, [], INSTALL_COMPILER)
        self._probe("libjpeg-turbo (jpeglib.h, -ljpeg)", PROBE_JPEG, ["jpeg"], INSTALL_JPEG)
        self._probe("libpng >= 1.6 (png.h, -lpng)", PROBE_PNG, ["png"], INSTALL_PNG)
        super().build_extensions()

    def _probe(self, what, source, libraries, hint):
        ext = self.extensions[0]
        tmp = tempfile.mkdtemp(prefix="fastload-probe-")
        try:
            src = os.path.join(tmp, "probe.cc")
            with open(src, "w") as f:
                f.write(source)
            objects = self.compiler.compile(
                [src],
                output_dir=tmp,
                include_dirs=ext.include_dirs,
                extra_postargs=["-std=c++17"],
            )
            self.compiler.link_executable(
                objects,
                "probe",
                output_dir=tmp,
                libraries=libraries,
                library_dirs=ext.library_dirs,
                target_lang="c++",
            )
        except (CompileError, LinkError, ExecError, OSError) as e:
            sys.exit(
                f"\nfastload: cannot build the native extension: {what} not found or not "
                f"working.\n{hint}\n(probe failed: {e})\n"
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


# One compiler per core: setuptools compiles the sources one after another, which on the lent GPU machines'
# 16 cores spent minutes of `make gpu-check`'s ten-minute budget on the build.
# The cores this process may use (affinity), not multiprocessing.cpu_count(): in a container that is the host's.
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
ParallelCompile("FASTLOAD_BUILD_JOBS", default=_cores).install()

_compile_args, _link_args = _flags()
_include_dirs, _library_dirs = _jpeg_dirs()

setup(
    ext_modules=[
        Pybind11Extension(
            "fastload._C",
            SOURCES,
            depends=[os.path.join("csrc", f) for f in sorted(os.listdir("csrc")) if f.endswith(".h")],
            cxx_std=17,
            include_dirs=["csrc"] + _include_dirs,
            library_dirs=_library_dirs,
            libraries=["jpeg", "png"],  # png: mask fields (csrc/mask.cc, libpng's simplified API)
            extra_compile_args=_compile_args,
            extra_link_args=_link_args,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)

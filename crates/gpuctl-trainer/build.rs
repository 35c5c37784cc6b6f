//! Builds the allocator bridge (shim/alloc_shim.cpp) against the libtorch that torch-sys
//! links, found the same way: `LIBTORCH_USE_PYTORCH=1` asks the active Python's torch, or
//! `LIBTORCH` names an unpacked libtorch. The CUDA part is compiled in when that libtorch has
//! libc10_cuda and the CUDA runtime headers are found (the pip wheels ship them).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const PYTHON_DETAILS: &str = r#"
import pathlib, torch
from torch.utils import cpp_extension
root = pathlib.Path(torch.__file__).parent
print("LIB", root / "lib")
for include in cpp_extension.include_paths():
    print("INCLUDE", include)
print("CXX11", int(torch._C._GLIBCXX_USE_CXX11_ABI))
try:
    import nvidia
    for base in nvidia.__path__:
        for header in pathlib.Path(base).glob("*/include/cuda_runtime_api.h"):
            print("CUDA_INCLUDE", header.parent)
except ImportError:
    pass
"#;

struct Libtorch {
    lib: PathBuf,
    includes: Vec<PathBuf>,
    cxx11_abi: bool,
    cuda_includes: Vec<PathBuf>,
}

fn main() {
    for name in [
        "LIBTORCH",
        "LIBTORCH_USE_PYTORCH",
        "VIRTUAL_ENV",
        "CUDA_HOME",
    ] {
        println!("cargo:rerun-if-env-changed={name}");
    }
    println!("cargo:rerun-if-changed=shim/alloc_shim.cpp");
    let libtorch = find_libtorch();

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("shim/alloc_shim.cpp")
        .flag("-std=c++17")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .define(
            "_GLIBCXX_USE_CXX11_ABI",
            if libtorch.cxx11_abi { "1" } else { "0" },
        );
    for include in &libtorch.includes {
        build.include(include);
    }
    let cuda = libtorch.lib.join("libc10_cuda.so").exists() && !libtorch.cuda_includes.is_empty();
    if cuda {
        build.define("GPUCTL_SHIM_CUDA", None);
        for include in &libtorch.cuda_includes {
            build.include(include);
        }
    }
    build.compile("gpuctl_alloc_shim");

    println!("cargo:rustc-link-search=native={}", libtorch.lib.display());
    if cuda {
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    // The binary finds libtorch where it was built against; elsewhere (the GPU machines'
    // own torch) LD_LIBRARY_PATH names it.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libtorch.lib.display());
}

fn find_libtorch() -> Libtorch {
    if env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        return from_python();
    }
    if let Some(root) = env::var_os("LIBTORCH").map(PathBuf::from) {
        let cuda_home = env::var_os("CUDA_HOME").map(PathBuf::from);
        return Libtorch {
            lib: root.join("lib"),
            includes: vec![
                root.join("include"),
                root.join("include/torch/csrc/api/include"),
            ],
            cxx11_abi: true,
            cuda_includes: cuda_home
                .map(|home| home.join("include"))
                .filter(|dir| dir.join("cuda_runtime_api.h").exists())
                .into_iter()
                .collect(),
        };
    }
    panic!(
        "gpuctl-trainer needs libtorch 2.11: set LIBTORCH_USE_PYTORCH=1 with torch==2.11.0 \
         in the active Python (scripts/libtorch-env does this), or LIBTORCH=/path/to/libtorch"
    );
}

fn from_python() -> Libtorch {
    let python = if env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let output = Command::new(python)
        .arg("-c")
        .arg(PYTHON_DETAILS)
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    assert!(
        output.status.success(),
        "{python} could not import torch: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut libtorch = Libtorch {
        lib: PathBuf::new(),
        includes: Vec::new(),
        cxx11_abi: true,
        cuda_includes: Vec::new(),
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "LIB" => libtorch.lib = PathBuf::from(value),
            "INCLUDE" => libtorch.includes.push(PathBuf::from(value)),
            "CXX11" => libtorch.cxx11_abi = value == "1",
            "CUDA_INCLUDE" => libtorch.cuda_includes.push(PathBuf::from(value)),
            _ => {}
        }
    }
    assert!(
        Path::new(&libtorch.lib).join("libc10.so").exists(),
        "no libc10.so under {}",
        libtorch.lib.display()
    );
    libtorch
}

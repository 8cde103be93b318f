//! Embeds the descriptor set that `envoy-types` was generated from (its
//! `src/generated/types.bin`), found through `cargo metadata`, so that proto3 JSON handled by
//! reflection always agrees with the generated types. Nothing is copied into the repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let source = envoy_types_dir(&manifest_dir).join("src/generated/types.bin");
    let bytes = fs::read(&source).unwrap_or_else(|e| {
        panic!(
            "reading the envoy-types descriptor set {}: {e}",
            source.display()
        )
    });
    fs::write(out_dir.join("envoy_types.bin"), bytes).expect("writing OUT_DIR/envoy_types.bin");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed=build.rs");
}

/// The source folder of the `envoy-types` package this crate resolves to.
fn envoy_types_dir(manifest_dir: &Path) -> PathBuf {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = env::var("TARGET").expect("set by cargo");
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ])
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .output()
        .expect("running cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages list");
    let envoy_types = packages
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .expect("envoy-types is a dependency");
    let manifest = envoy_types["manifest_path"]
        .as_str()
        .expect("manifest_path");
    Path::new(manifest)
        .parent()
        .expect("package folder")
        .to_path_buf()
}

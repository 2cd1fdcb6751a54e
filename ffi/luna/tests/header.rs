//! The CI currency check of `include/luna.h`: regenerate it with cbindgen and fail if
//! the committed one differs. `LUNA_UPDATE_HEADER=1 cargo test -p luna-capi --test
//! header` rewrites it.

use std::path::Path;

#[test]
fn luna_h_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates luna.h")
        .write(&mut fresh);
    let path = dir.join("include/luna.h");
    if std::env::var_os("LUNA_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/luna.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "ffi/luna/include/luna.h is stale: run `LUNA_UPDATE_HEADER=1 cargo test -p luna-capi --test header` and commit it"
    );
}

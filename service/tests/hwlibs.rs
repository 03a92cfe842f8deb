//! Issue 29: the service links no TPM or FIDO2 library; only the helpers `dirseal-tpm2` and
//! `dirseal-fido2` do (docs/architecture.md, "Hardware helpers").
use std::process::Command;

#[test]
fn the_service_links_no_tpm_or_fido2_library() {
    let out = Command::new("ldd").arg(env!("CARGO_BIN_EXE_dirsealed")).output().expect("ldd");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("libc.so"), "ldd must list libraries: {text}");
    for lib in ["libtss2-", "libfido2.so", "libcbor.so", "libudev.so"] {
        assert!(!text.contains(lib), "dirsealed links {lib}: {text}");
    }
}

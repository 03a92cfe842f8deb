//! The helpers as built: each greets in the library's protocol and ends when its input closes.
//! Their work is tested from the library's side (tests/tpm2.rs, tests/fido2.rs, tests/hwlibs.rs in
//! the root package), which finds them beside `dirseal` in target/<profile>. Naming them here with
//! `CARGO_BIN_EXE_` also makes `cargo test --workspace` build them there, as it did when they were
//! bins of the root package.
use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn each_helper_greets_and_ends_with_its_input() {
    // The library's greeting (core/src/sys/helper.rs): one workspace version for both.
    let hello = concat!("dirseal-helper/1 ", env!("CARGO_PKG_VERSION"));
    for helper in [env!("CARGO_BIN_EXE_dirseal-tpm2"), env!("CARGO_BIN_EXE_dirseal-fido2")] {
        let mut child = Command::new(helper)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{helper}: {e}"));
        let mut len = [0u8; 4];
        child.stdout.as_mut().unwrap().read_exact(&mut len).unwrap();
        let mut greeting = vec![0u8; u32::from_le_bytes(len) as usize];
        child.stdout.as_mut().unwrap().read_exact(&mut greeting).unwrap();
        assert_eq!(String::from_utf8_lossy(&greeting), hello, "{helper}");
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{helper}: {} {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
}

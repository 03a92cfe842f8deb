//! Shared by the CLI integration tests: a real loop-mounted ext4, a private keystore and config,
//! and the real `dirseal` binary.
// Each suite uses only part of this module.
#![allow(dead_code, unused_imports)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub use dirseal_testfs::{fresh_id as fresh_uid, names, Options, TestFs, FAST_CONFIG};

pub struct Env {
    pub fs: TestFs,
    pub etc: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env::with(Options::default())
    }

    pub fn with(opts: Options) -> Env {
        let fs = TestFs::with(opts);
        let etc = tempfile::tempdir().expect("tempdir");
        std::fs::write(etc.path().join("config.toml"), FAST_CONFIG).expect("config");
        Env { fs, etc }
    }

    pub fn mnt(&self) -> &Path {
        self.fs.path()
    }

    pub fn keystore(&self) -> PathBuf {
        self.etc.path().join("ks")
    }

    pub fn config(&self) -> PathBuf {
        self.etc.path().join("config.toml")
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dirseal"));
        c.args(args).env("DIRSEAL_CONFIG", self.config()).env("DIRSEAL_KEYSTORE", self.keystore());
        c
    }

    /// Runs dirseal with `stdin` piped in (one secret per line).
    pub fn run(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dirseal");
        let mut input = child.stdin.take().expect("stdin");
        // Ignore EPIPE: a command may fail before reading its input.
        let _ = input.write_all(stdin.as_bytes());
        drop(input);
        child.wait_with_output().expect("wait dirseal")
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(
            out.status.success(),
            "dirseal {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs and requires failure; returns stderr.
    pub fn fails(&self, args: &[&str], stdin: &str) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.status.success(),
            "dirseal {args:?} unexpectedly succeeded:\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn status_json(&self, dir: &Path) -> serde_json::Value {
        let s = self.ok(&["status", "--json", p(dir)], "");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("status json {e}: {s}"))
    }
}

pub fn p(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

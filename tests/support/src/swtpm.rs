//! A software TPM per test: `swtpm socket` on two free 127.0.0.1 ports with its own state dir,
//! killed (and reaped) on drop.
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Swtpm {
    child: Child,
    port: u16,
    state: tempfile::TempDir,
}

/// Two consecutive free ports (server, control), as far as a bind can tell.
fn free_port_pair() -> Option<u16> {
    for _ in 0..50 {
        let l = TcpListener::bind("127.0.0.1:0").ok()?;
        let port = l.local_addr().ok()?.port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return Some(port);
        }
    }
    None
}

impl Swtpm {
    /// A fresh TPM (manufactured on first start: 3 tries, 1000 s recovery).
    pub fn start() -> Swtpm {
        Swtpm::try_start(None).unwrap_or_else(|e| panic!("swtpm: {e}"))
    }

    /// A fresh TPM whose lockout hierarchy already has a password ([`Swtpm::OWNER_AUTH`]), as on a
    /// machine where the OS or `dirseal tpm2 setup` owns it: the state in which dirseal lets a
    /// PIN guard a key (with an empty lockout password anyone could reset the count of wrong PINs).
    pub fn start_owned() -> Swtpm {
        let t = Swtpm::start();
        t.own_lockout(Swtpm::OWNER_AUTH);
        t
    }

    /// The lockout password [`Swtpm::start_owned`] sets, for tests that act as that owner.
    pub const OWNER_AUTH: &'static str = "test-lockout-owner";

    /// Gives the lockout hierarchy the password `auth` (it must be empty now), with tpm2-tools.
    pub fn own_lockout(&self, auth: &str) {
        if let Err(e) = self.tool(&["tpm2_changeauth", "-c", "lockout", auth]) {
            panic!("{e}");
        }
    }

    /// A TPM whose state starts as a copy of the files in `state` (a committed golden state).
    pub fn start_with_state(state: &Path) -> Swtpm {
        Swtpm::try_start(Some(state)).unwrap_or_else(|e| panic!("swtpm: {e}"))
    }

    pub fn try_start(from: Option<&Path>) -> Result<Swtpm, String> {
        let state = tempfile::Builder::new().prefix("dirseal-swtpm.").tempdir().map_err(|e| e.to_string())?;
        if let Some(from) = from {
            for e in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
                let e = e.map_err(|e| e.to_string())?;
                std::fs::copy(e.path(), state.path().join(e.file_name())).map_err(|e| e.to_string())?;
            }
        }
        // Another process may take the ports between the probe and swtpm's bind: retry then.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port_pair().ok_or("no free port pair on 127.0.0.1")?;
            let mut child = Command::new("swtpm")
                .args(["socket", "--tpm2", "--server"])
                .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
                .arg("--ctrl")
                .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
                .args(["--flags", "not-need-init,startup-clear", "--tpmstate"])
                .arg(format!("dir={}", state.path().display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run swtpm (install swtpm: scripts/deps.sh): {e}"))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut s) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut s, &mut err);
                    }
                    last = format!("swtpm exited ({status}): {}", err.trim());
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(Swtpm { child, port, state });
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("swtpm did not start listening within 10 s".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(last)
    }

    /// The TCTI string for tss-esapi, tpm2-tools and dirseal's `tpm2.tcti`.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// The directory swtpm keeps its state in.
    pub fn state_dir(&self) -> PathBuf {
        self.state.path().to_path_buf()
    }

    /// Runs a tpm2-tools command against this TPM, e.g. `["tpm2_pcrextend", "7:sha256=00..."]`.
    pub fn tool(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(args[0])
            .args(&args[1..])
            .env("TPM2TOOLS_TCTI", self.tcti())
            .output()
            .map_err(|e| format!("{}: {e}", args[0]))?;
        if !out.status.success() {
            return Err(format!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Extends SHA-256 PCR `pcr` with a fixed digest, as a changed boot component would.
    pub fn pcr_extend(&self, pcr: u8) {
        let arg = format!("{pcr}:sha256={}", "ab".repeat(32));
        if let Err(e) = self.tool(&["tpm2_pcrextend", &arg]) {
            panic!("{e}");
        }
    }

    /// Stops the TPM cleanly (TPM2_Shutdown, then the process) so its state dir can be copied
    /// and reused: without the orderly shutdown the next start counts a dictionary-attack failure.
    pub fn stop(&mut self) {
        if let Err(e) = self.tool(&["tpm2_shutdown"]) {
            panic!("{e}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

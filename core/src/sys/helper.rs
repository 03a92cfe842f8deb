//! The hardware helpers: TPM and FIDO2 operations run in a separate program (`dirseal-tpm2`,
//! `dirseal-fido2`), the only binaries that link libtss2-* and libfido2. The CLI, the PAM module
//! and the service start one only when a TPM or FIDO2 protector is used, so a password login maps
//! none of those libraries, a crash in one is the helper's alone, and a machine without them still
//! runs everything else (docs/architecture.md, "Hardware helpers").
//!
//! The protocol is one request, one response, over the helper's stdin and stdout: each message is
//! a 4-byte little-endian length and that many bytes of JSON (at most [`MAX_FRAME`]), parsed into
//! the kind's typed request or response, unknown fields refused. Secrets travel only there — never
//! in argv or the environment (the helper starts with an empty one) — and the buffers that hold
//! them are wiped. The helper greets first with the protocol version, so a helper from another
//! release, or one whose libraries are missing (the dynamic loader's message on stderr), is
//! reported before anything is asked.
//!
//! Where the helper is: never from `PATH` or the environment. The candidates are fixed: next to
//! the program (or shared object) the calling code runs in, `../libexec/` from it, then
//! `/usr/libexec` and `/usr/local/libexec`. A privileged caller takes only a root-owned file in a
//! root-owned directory that neither group nor others may write.
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zeroize::Zeroizing;

/// The largest message either side accepts.
pub const MAX_FRAME: usize = 1 << 20;
/// The helper's first message: protocol and release, which must match the caller's.
const HELLO: &str = concat!("dirseal-helper/1 ", env!("CARGO_PKG_VERSION"));
/// How long a helper may take to start and greet.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the helper's stderr kept for an error message.
const STDERR_CAP: u64 = 4096;

/// Which helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    /// `dirseal-tpm2`: links tss-esapi (libtss2-esys, -tctildr, -mu, -sys).
    Tpm2,
    /// `dirseal-fido2`: links libfido2 (and its libcbor, libudev, libcrypto).
    Fido2,
}

impl Helper {
    /// The program's file name.
    pub fn program(self) -> &'static str {
        match self {
            Helper::Tpm2 => "dirseal-tpm2",
            Helper::Fido2 => "dirseal-fido2",
        }
    }
}

/// Why a helper could not do what was asked, before the kind's own error.
#[derive(Debug)]
pub enum HelperError {
    /// A shared library the helper links is missing (its file name).
    NotInstalled(String),
    /// The helper could not be found, started, or did not answer properly (why).
    Failed(String),
}

/// Bytes that are a secret on the wire: hex in the JSON, wiped when dropped.
pub struct WireSecret(pub Zeroizing<Vec<u8>>);

impl WireSecret {
    /// A copy of `b`.
    pub fn new(b: &[u8]) -> WireSecret {
        WireSecret(Zeroizing::new(b.to_vec()))
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for WireSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let h = Zeroizing::new(hex::encode(&*self.0));
        s.serialize_str(&h)
    }
}

impl<'de> Deserialize<'de> for WireSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WireSecret, D::Error> {
        // Borrowed from the (wiped) frame: hex has no escapes, so serde_json lends the bytes.
        let h: &str = Deserialize::deserialize(d)?;
        let mut v = Zeroizing::new(vec![0u8; h.len() / 2]);
        hex::decode_to_slice(h, &mut v[..]).map_err(serde::de::Error::custom)?;
        Ok(WireSecret(v))
    }
}

fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::other("message too large"));
    }
    // Invariant: MAX_FRAME fits in u32.
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// `None` at a clean end of input (no byte of a new frame).
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Zeroizing<Vec<u8>>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("message of {len} bytes, more than {MAX_FRAME}")));
    }
    let mut body = Zeroizing::new(vec![0u8; len]);
    r.read_exact(&mut body[..])?;
    Ok(Some(body))
}

fn to_frame<T: Serialize>(v: &T) -> Result<Zeroizing<Vec<u8>>, String> {
    // Room for any message, so that the buffer holding secrets is never reallocated (and the
    // old copy left behind).
    let mut buf = Zeroizing::new(Vec::with_capacity(64 * 1024));
    serde_json::to_writer(&mut *buf, v).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// The helper's side: greets, then answers each request with `handle` until stdin closes.
/// A message it cannot read ends it (status 2); the caller reports that.
pub fn serve<Q: DeserializeOwned, R: Serialize>(program: &str, mut handle: impl FnMut(Q) -> R) -> ExitCode {
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    if write_frame(&mut output, HELLO.as_bytes()).is_err() {
        return ExitCode::from(2);
    }
    loop {
        let req = match read_frame(&mut input) {
            Ok(Some(f)) => f,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{program}: reading a request: {e}");
                return ExitCode::from(2);
            }
        };
        let req: Q = match serde_json::from_slice(&req) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("{program}: not a request this helper understands: {e}");
                return ExitCode::from(2);
            }
        };
        let out = match to_frame(&handle(req)) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("{program}: encoding the response: {e}");
                return ExitCode::from(2);
            }
        };
        if write_frame(&mut output, &out).is_err() {
            return ExitCode::from(2);
        }
    }
}

/// A running helper: one per TPM connection or opened security key; it ends when this drops.
pub struct Session {
    kind: Helper,
    path: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
}

impl Session {
    /// Starts the helper and waits for its greeting.
    pub fn start(kind: Helper) -> Result<Session, HelperError> {
        let path = locate(kind.program())?;
        let mut cmd = Command::new(&path);
        cmd.env_clear().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // The helper gets stdin, stdout and stderr only: a PAM module runs in sshd or sudo, whose
        // other descriptors (the client's connection, a tty) are none of its business.
        // SAFETY: the closure runs in the child between fork and exec and only makes one
        // async-signal-safe system call (close_range with CLOSE_RANGE_CLOEXEC, Linux 5.11: the
        // descriptors close at exec, so std's own exec-error pipe still works); on an older
        // kernel it fails and changes nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
                libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| HelperError::Failed(format!("cannot start {}: {e}", path.display())))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            // Invariant: both were asked for as pipes above.
            _ => unreachable!("piped stdin and stdout"),
        };
        let mut s = Session { kind, path, child, stdin: Some(stdin), stdout };
        let hello = s.exchange(None, START_TIMEOUT)?;
        if hello[..] != *HELLO.as_bytes() {
            return Err(HelperError::Failed(format!(
                "{} is from another dirseal release ({:?}, this is {HELLO:?}); reinstall dirseal",
                s.path.display(),
                String::from_utf8_lossy(&hello)
            )));
        }
        Ok(s)
    }

    /// The helper's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `req` and reads the response, waiting at most `timeout` (then the helper is killed).
    pub fn call<Q: Serialize, R: DeserializeOwned>(&mut self, req: &Q, timeout: Duration) -> Result<R, HelperError> {
        let frame = to_frame(req).map_err(|e| HelperError::Failed(format!("encoding the request: {e}")))?;
        let resp = self.exchange(Some(&frame), timeout)?;
        serde_json::from_slice(&resp).map_err(|e| {
            HelperError::Failed(format!(
                "{} answered something this program does not understand: {e}",
                self.path.display()
            ))
        })
    }

    /// Writes `req` (if any) and reads one frame, waiting at most `timeout` (then the helper is
    /// killed, which ends the read).
    fn exchange(&mut self, req: Option<&[u8]>, timeout: Duration) -> Result<Zeroizing<Vec<u8>>, HelperError> {
        // The child is not reaped before this session drops, so its pid cannot be reused meanwhile.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let (stdin, stdout) = (&mut self.stdin, &mut self.stdout);
        let (r, timed_out) = std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            scope.spawn(move || {
                // Writing to a helper that died raises SIGPIPE in the writing thread. Blocked in
                // this one, it stays pending here and the write fails with EPIPE: the process
                // running the PAM module (sshd, sudo) keeps its own SIGPIPE disposition.
                let _ = nix::sys::signal::SigSet::from(nix::sys::signal::Signal::SIGPIPE).thread_block();
                let mut io = || -> std::io::Result<Option<Zeroizing<Vec<u8>>>> {
                    if let Some(req) = req {
                        write_frame(stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?, req)?;
                    }
                    read_frame(stdout)
                };
                let _ = tx.send(io());
            });
            match rx.recv_timeout(timeout) {
                Ok(r) => (r, false),
                Err(_) => {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    (rx.recv().unwrap_or(Ok(None)), true)
                }
            }
        });
        match r {
            Ok(Some(f)) if !timed_out => Ok(f),
            _ if timed_out => Err(HelperError::Failed(format!(
                "{} did not answer within {} s and was stopped",
                self.path.display(),
                timeout.as_secs()
            ))),
            _ => Err(self.died()),
        }
    }

    /// What became of a helper that stopped answering: its exit and what it said on stderr.
    fn died(&mut self) -> HelperError {
        self.stdin = None;
        let mut err = String::new();
        if let Some(e) = self.child.stderr.take() {
            let _ = e.take(STDERR_CAP).read_to_string(&mut err);
        }
        let status = self.child.wait();
        if let Some(lib) = missing_library(&err) {
            return HelperError::NotInstalled(lib);
        }
        let how = match status {
            Ok(s) => match std::os::unix::process::ExitStatusExt::signal(&s) {
                Some(sig) => format!("was killed by signal {sig}"),
                None => format!("ended ({s})"),
            },
            Err(e) => format!("ended ({e})"),
        };
        let said = err.trim();
        let said = if said.is_empty() { String::new() } else { format!(": {said}") };
        HelperError::Failed(format!("the {} helper {} {how}{said}", what(self.kind), self.path.display()))
    }
}

/// The library the dynamic loader could not load, from its message ("prog: error while loading
/// shared libraries: libx.so.1: cannot open shared object file: …", or "…: file too short").
fn missing_library(stderr: &str) -> Option<String> {
    let rest = stderr.split("error while loading shared libraries: ").nth(1)?;
    // A file that is there but unusable is named by its path: its name is what to install.
    let lib = rest.split(':').next()?.trim().rsplit('/').next()?;
    (!lib.is_empty()).then(|| lib.to_string())
}

fn what(kind: Helper) -> &'static str {
    match kind {
        Helper::Tpm2 => "TPM",
        Helper::Fido2 => "security key",
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // End of input: the helper releases the device (flushes TPM objects, closes the key) and
        // exits.
        self.stdin = None;
        if let Ok(None) = self.child.try_wait() {
            let (tx, rx) = mpsc::channel::<()>();
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let watchdog = std::thread::spawn(move || {
                if rx.recv_timeout(Duration::from_secs(10)) == Err(mpsc::RecvTimeoutError::Timeout) {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            });
            let _ = self.child.wait();
            drop(tx);
            let _ = watchdog.join();
        }
    }
}

/// The directory the calling code was loaded from: the PAM module's own directory when this
/// library runs inside one, else the running program's.
fn own_dir() -> Option<PathBuf> {
    let file = super::loaded_from().or_else(|| std::fs::read_link("/proc/self/exe").ok())?;
    file.parent().map(Path::to_path_buf)
}

/// The fixed places a helper may be, in order.
fn candidates(program: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = own_dir() {
        dirs.push(d.clone());
        // A test binary of this workspace runs from target/<profile>/deps.
        if d.file_name().is_some_and(|n| n == "deps") {
            dirs.extend(d.parent().map(Path::to_path_buf));
        }
        // PREFIX/sbin/dirseal → PREFIX/libexec.
        dirs.extend(d.parent().map(|p| p.join("libexec")));
    }
    dirs.push(PathBuf::from("/usr/libexec"));
    dirs.push(PathBuf::from("/usr/local/libexec"));
    dirs.into_iter().map(|d| d.join(program)).collect()
}

/// For a privileged caller: root's file in root's directory, writable by nobody else.
fn trusted(path: &Path) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    for p in [Some(path), path.parent()].into_iter().flatten() {
        let md = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if md.uid() != 0 || md.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is not root's alone (owner uid {}, mode {:o})",
                p.display(),
                md.uid(),
                md.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

fn locate(program: &str) -> Result<PathBuf, HelperError> {
    let mut refused = Vec::new();
    for c in candidates(program) {
        if !c.is_file() {
            continue;
        }
        match trusted(&c) {
            Ok(()) => return Ok(c),
            Err(e) => refused.push(e),
        }
    }
    let looked = candidates(program).iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let refused = if refused.is_empty() { String::new() } else { format!("; refused: {}", refused.join("; ")) };
    Err(HelperError::Failed(format!(
        "the helper program {program} is not installed (looked in {looked}{refused}); reinstall dirseal"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"{\"a\":1}").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(&read_frame(&mut r).unwrap().unwrap()[..], b"{\"a\":1}");
        assert_eq!(&read_frame(&mut r).unwrap().unwrap()[..], b"");
        assert!(read_frame(&mut r).unwrap().is_none(), "a clean end");
        let mut big = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        big.extend_from_slice(b"x");
        assert!(read_frame(&mut &big[..]).is_err());
        assert!(read_frame(&mut &[1u8, 0][..]).is_err(), "a truncated length");
        assert!(read_frame(&mut &[4u8, 0, 0, 0, b'x'][..]).is_err(), "a truncated body");
    }

    #[test]
    fn secrets_travel_as_hex() {
        let s = WireSecret::new(&[0, 1, 0xfe]);
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(j, "\"0001fe\"");
        let back: WireSecret = serde_json::from_str(&j).unwrap();
        assert_eq!(back.as_bytes(), &[0, 1, 0xfe]);
        assert!(serde_json::from_str::<WireSecret>("\"0g\"").is_err());
        assert!(serde_json::from_str::<WireSecret>("\"abc\"").is_err());
    }

    #[test]
    fn the_loaders_message_names_the_missing_library() {
        let gone = "/usr/libexec/dirseal-tpm2: error while loading shared libraries: libtss2-esys.so.0: cannot open shared object file: No such file or directory\n";
        assert_eq!(missing_library(gone).as_deref(), Some("libtss2-esys.so.0"));
        let empty = "dirseal-fido2: error while loading shared libraries: /lib/x86_64-linux-gnu/libfido2.so.1: file too short\n";
        assert_eq!(missing_library(empty).as_deref(), Some("libfido2.so.1"));
        assert_eq!(missing_library("dirseal-tpm2: reading a request: unexpected end of file"), None);
    }
}

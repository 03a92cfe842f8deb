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
//! `/usr/libexec` and `/usr/local/libexec`. A privileged caller takes only a file that root alone
//! can change, reached through directories (and symlinks) that root alone can change, from `/`
//! down; it runs the very descriptor it checked, never the path again.
//!
//! Containment: the helper runs in its own process group, which a timeout kills whole; it starts
//! with no core dumps and not dumpable (no core file, no ptrace or /proc/PID/mem by its uid), and
//! sets both again itself after exec ([`serve`]), since exec makes it dumpable again.
use std::ffi::{CStr, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rustix::fs::{FileType, Mode, OFlags};

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
    /// Every helper: data/programs lists exactly these as `helper`s (the test below holds it to
    /// that), so installers and packaging need no other registration.
    pub const ALL: [Helper; 2] = [Helper::Tpm2, Helper::Fido2];

    /// The program's file name.
    pub fn program(self) -> &'static str {
        match self {
            Helper::Tpm2 => "dirseal-tpm2",
            Helper::Fido2 => "dirseal-fido2",
        }
    }

    /// The program's file name as its `argv[0]`.
    fn argv0(self) -> &'static CStr {
        match self {
            Helper::Tpm2 => c"dirseal-tpm2",
            Helper::Fido2 => c"dirseal-fido2",
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

/// No core file, and not dumpable (no ptrace, no /proc/PID/mem or environ by the same uid): a
/// helper run by root holds protector keys, PINs and hmac-secrets. Called in the caller's forked
/// child, a copy of the caller's memory until exec, and by the helper itself in [`serve`]: exec of
/// a program that is not set-user-ID makes a process dumpable again (the core limit stays).
fn no_core_dumps() -> rustix::io::Result<()> {
    rustix::process::setrlimit(
        rustix::process::Resource::Core,
        rustix::process::Rlimit { current: Some(0), maximum: Some(0) },
    )?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
}

/// The helper's side: turns core dumps off, greets, then answers each request with `handle` until
/// stdin closes. A message it cannot read ends it (status 2); the caller reports that.
pub fn serve<Q: DeserializeOwned, R: Serialize>(program: &str, mut handle: impl FnMut(Q) -> R) -> ExitCode {
    if let Err(e) = no_core_dumps() {
        eprintln!("{program}: cannot turn off core dumps ({e}); refusing to handle secrets");
        return ExitCode::from(2);
    }
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
    /// `None` once a call timed out: the thread left reading it has it.
    stdout: Option<ChildStdout>,
}

impl Session {
    /// Starts the helper and waits for its greeting.
    pub fn start(kind: Helper) -> Result<Session, HelperError> {
        Session::start_at(kind, &candidates(kind.program()))
    }

    /// Starts the first of `candidates` that may run (tests give their own).
    fn start_at(kind: Helper, candidates: &[PathBuf]) -> Result<Session, HelperError> {
        let Program { path, fd } = locate(kind.program(), candidates)?;
        // Not 0, 1 or 2 (free in a daemon that closed them): the child's stdio is put there
        // before the descriptor is executed.
        let fd = rustix::io::fcntl_dupfd_cloexec(&fd, 3)
            .map_err(|e| HelperError::Failed(format!("cannot start {}: {e}", path.display())))?;
        let argv0 = kind.argv0();
        // The path is for messages only: the child executes `fd`, the file that was checked.
        let mut cmd = Command::new(&path);
        cmd.env_clear().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Its own process group, so that a timeout stops whatever the helper started too (a
        // child left holding its stdout would keep the caller reading).
        cmd.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and makes only
        // async-signal-safe, allocation-free system calls (see `become_helper`); it owns `fd`,
        // which stays open in the parent until `cmd` drops after the spawn.
        unsafe {
            cmd.pre_exec(move || Err(become_helper(fd.as_fd(), argv0)));
        }
        let mut child =
            cmd.spawn().map_err(|e| HelperError::Failed(format!("cannot start {}: {e}", path.display())))?;
        drop(cmd);
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            // Invariant: both were asked for as pipes above.
            _ => unreachable!("piped stdin and stdout"),
        };
        let mut s = Session { kind, path, child, stdin: Some(stdin), stdout: Some(stdout) };
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
        let resp = self.exchange(Some(frame), timeout)?;
        serde_json::from_slice(&resp).map_err(|e| {
            HelperError::Failed(format!(
                "{} answered something this program does not understand: {e}",
                self.path.display()
            ))
        })
    }

    /// The helper's process group: its pid (see `start_at`). Until the helper is reaped (when
    /// this session drops) that id cannot be reused, so the group is this helper's.
    fn group(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Writes `req` (if any) and reads one frame, waiting at most `timeout`; then the helper's
    /// whole process group is killed and the error returned at once.
    fn exchange(
        &mut self,
        req: Option<Zeroizing<Vec<u8>>>,
        timeout: Duration,
    ) -> Result<Zeroizing<Vec<u8>>, HelperError> {
        let Some(mut stdout) = self.stdout.take() else {
            return Err(HelperError::Failed(format!(
                "{} was stopped after an earlier call failed; start it again",
                self.path.display()
            )));
        };
        let mut stdin = self.stdin.take();
        let (tx, rx) = mpsc::channel();
        // A thread of its own, not a scoped one: after a timeout it is left behind rather than
        // waited for, since whatever still holds the pipe (a process that left the helper's
        // group) may never close it. It owns the pipes, and ends and drops them when they close.
        std::thread::Builder::new()
            .name("dirseal-helper".into())
            .spawn(move || {
                // Writing to a helper that died raises SIGPIPE in the writing thread. Blocked in
                // this one, it stays pending here and the write fails with EPIPE: the process
                // running the PAM module (sshd, sudo) keeps its own SIGPIPE disposition.
                let _ = nix::sys::signal::SigSet::from(Signal::SIGPIPE).thread_block();
                let mut io = || -> std::io::Result<Option<Zeroizing<Vec<u8>>>> {
                    if let Some(req) = &req {
                        write_frame(stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?, req)?;
                    }
                    read_frame(&mut stdout)
                };
                let r = io();
                let _ = tx.send((r, stdin, stdout));
            })
            .map_err(|e| HelperError::Failed(format!("cannot talk to {}: no thread ({e})", self.path.display())))?;
        match rx.recv_timeout(timeout) {
            Ok((r, stdin, stdout)) => {
                (self.stdin, self.stdout) = (stdin, Some(stdout));
                match r {
                    Ok(Some(f)) => Ok(f),
                    _ => Err(self.died()),
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.died()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = killpg(self.group(), Signal::SIGKILL);
                Err(HelperError::Failed(format!(
                    "{} did not answer within {} s and was stopped",
                    self.path.display(),
                    timeout.as_secs()
                )))
            }
        }
    }

    /// What became of a helper that stopped answering: its exit and what it said on stderr.
    fn died(&mut self) -> HelperError {
        self.stdin = None;
        // The helper closed its stdout, so it has ended or is of no more use; whatever it left
        // running in its group goes too, or a child holding stderr would keep the read below
        // waiting (the group is still the helper's: it is reaped only below). Its exit status
        // stands if it had exited.
        let _ = killpg(self.group(), Signal::SIGKILL);
        let (tx, rx) = mpsc::channel();
        if let Some(e) = self.child.stderr.take() {
            // Left behind if a process outside the group holds stderr open.
            let _ = std::thread::Builder::new().name("dirseal-helper".into()).spawn(move || {
                let mut err = String::new();
                let _ = e.take(STDERR_CAP).read_to_string(&mut err);
                let _ = tx.send(err);
            });
        }
        let err = rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
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
        let group = self.group();
        let (tx, rx) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if rx.recv_timeout(Duration::from_secs(10)) == Err(mpsc::RecvTimeoutError::Timeout) {
                let _ = killpg(group, Signal::SIGKILL);
            }
        });
        // Waits for the helper's end without reaping it, so that the group's id stays this
        // helper's for both kills (ECHILD: `died` has reaped it already, after its own kill).
        let ended = loop {
            use nix::sys::wait::{waitid, Id, WaitPidFlag};
            match waitid(Id::Pid(group), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.is_ok(),
            }
        };
        drop(tx);
        let _ = watchdog.join();
        if ended {
            // Whatever the helper left running ends with it.
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = self.child.wait();
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

/// In the forked child: turns core dumps off, marks every inherited descriptor but stdio
/// close-on-exec, and executes `fd`. Returns only why that failed (std hands it to the parent,
/// whose spawn fails with it).
///
/// Executing the checked descriptor rather than its path is what makes the check hold: a path
/// resolved again could meet a symlink or a directory swapped since. `fexecve` (execveat with
/// `AT_EMPTY_PATH`) runs the file from this process's descriptor; a `/proc/self/fd/N` path given
/// to `Command` would do the same only in the child's table and only with /proc mounted.
/// Everything here is a plain system call: no allocation between fork and exec.
fn become_helper(fd: BorrowedFd<'_>, argv0: &'static CStr) -> std::io::Error {
    if let Err(e) = no_core_dumps() {
        return e.into();
    }
    // The helper gets stdin, stdout and stderr only: a PAM module runs in sshd or sudo, whose
    // other descriptors (the client's connection, a tty) are none of its business. `fd` is
    // among them, and an ELF program needs it no more once exec has opened it.
    close_from_on_exec(3);
    let e = super::fexecve(fd, argv0);
    if e != nix::errno::Errno::ENOENT {
        return e.into();
    }
    // A `#!` script (the tests' stand-in helpers): its interpreter is given /dev/fd/N, which
    // would be closed at exec, so the kernel refuses with ENOENT. A script keeps that descriptor.
    if let Err(e) = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()) {
        return e.into();
    }
    super::fexecve(fd, argv0).into()
}

/// close_range(first, ~0, CLOSE_RANGE_CLOEXEC) (Linux 5.11): the descriptors close at exec, so
/// std's own exec-error pipe still works. On an older kernel it fails and changes nothing.
fn close_from_on_exec(first: libc::c_uint) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: only sets close-on-exec flags; it closes nothing, and it is async-signal-safe.
    unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC) };
}

/// A helper found and opened (`O_PATH`): `fd` is the file that was checked, and the one run.
struct Program {
    path: PathBuf,
    fd: OwnedFd,
}

/// Root, or a set-user-ID program: then the helper must be root's alone, since whoever else could
/// change it would run code with these privileges.
fn privileged() -> bool {
    let euid = rustix::process::geteuid();
    euid.is_root() || euid != rustix::process::getuid()
}

/// For an unprivileged caller: any regular file at `path` (symlinks followed).
fn open_plain(path: &Path) -> Option<OwnedFd> {
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile).then_some(fd)
}

/// Owned by root and writable by neither group nor others. An ACL granting someone else write
/// shows as the group's write bit (the mask), so it is refused too; so is a sticky directory
/// such as /tmp, where anyone may add a file, as the helper's own directory. Further up
/// (`sticky_ok`), a root-owned sticky directory is no way in: nobody but root may rename or
/// remove the root-owned entry the walk goes on through, and an entry someone else made there is
/// refused as theirs (a checkout under /tmp, as CI's may be).
fn root_only(st: &rustix::fs::Stat, here: &Path, sticky_ok: bool) -> Result<(), String> {
    let mode = st.st_mode & 0o7777;
    if st.st_uid != 0 {
        return Err(format!("{} is owned by uid {}", here.display(), st.st_uid));
    }
    let sticky_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(sticky_ok && sticky_dir) {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "its group and everyone",
            (true, false) => "its group",
            _ => "everyone",
        };
        return Err(format!("{} can be written by {who} (mode {mode:o})", here.display()));
    }
    Ok(())
}

/// One step of a path being resolved.
enum Step {
    Root,
    Up,
    Name(OsString),
}

/// `p`'s steps, last first (a stack: a symlink's target is pushed on top).
fn steps(p: &Path) -> Vec<Step> {
    let mut v: Vec<Step> = p
        .components()
        .filter_map(|c| match c {
            Component::RootDir => Some(Step::Root),
            Component::ParentDir => Some(Step::Up),
            Component::Normal(n) => Some(Step::Name(n.to_owned())),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    v.reverse();
    v
}

/// For a privileged caller: opens `path` the way the kernel would resolve it, one component at a
/// time with `O_PATH|O_NOFOLLOW` from a held descriptor, following symlinks here, and checks every
/// directory from `/` down, every symlink and the file itself (`root_only`; a symlink only for its
/// owner, its mode means nothing). Whoever else could change any of them could put another program
/// there; and since each step opens from the descriptor just checked, nothing is looked up twice.
/// `Ok(None)`: nothing runnable there.
fn open_trusted(path: &Path) -> Result<Option<OwnedFd>, String> {
    // As the kernel's own limit (ELOOP).
    const MAX_SYMLINKS: usize = 40;
    let open = |dir: BorrowedFd<'_>, name: &OsStr| {
        rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
    };
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let root = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("/: {e}"))?;
    let st = rustix::fs::fstat(&root).map_err(|e| format!("/: {e}"))?;
    root_only(&st, Path::new("/"), false)?;
    // The directories walked so far, each checked: `..` goes back to the one before (the
    // directory this one was opened from), never to a parent that was not checked.
    let mut walked: Vec<(OwnedFd, PathBuf)> = vec![(root, PathBuf::from("/"))];
    let mut todo = steps(path);
    let mut links = 0;
    while let Some(step) = todo.pop() {
        let name = match step {
            Step::Root => {
                walked.truncate(1);
                continue;
            }
            Step::Up => {
                if walked.len() > 1 {
                    walked.pop();
                }
                continue;
            }
            Step::Name(n) => n,
        };
        // Invariant: `walked` always holds `/`.
        let (dir, dir_path) = walked.last().expect("the root stays");
        let here = dir_path.join(&name);
        let fd = match open(dir.as_fd(), &name) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", here.display())),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| format!("{}: {e}", here.display()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                if st.st_uid != 0 {
                    return Err(format!("{} is a symlink owned by uid {}", here.display(), st.st_uid));
                }
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(format!("{}: too many levels of symbolic links", path.display()));
                }
                let target =
                    rustix::fs::readlinkat(&fd, "", Vec::new()).map_err(|e| format!("{}: {e}", here.display()))?;
                todo.extend(steps(Path::new(OsStr::from_bytes(target.as_bytes()))));
            }
            FileType::Directory => {
                // More than the file's name left to walk: not the helper's own directory.
                root_only(&st, &here, todo.len() > 1)?;
                walked.push((fd, here));
            }
            FileType::RegularFile if todo.is_empty() => {
                root_only(&st, &here, false)?;
                return Ok(Some(fd));
            }
            _ => return Ok(None),
        }
    }
    // The path named a directory.
    Ok(None)
}

fn locate(program: &str, candidates: &[PathBuf]) -> Result<Program, HelperError> {
    let strict = privileged();
    let mut refused = Vec::new();
    for c in candidates {
        let found = if strict { open_trusted(c) } else { Ok(open_plain(c)) };
        match found {
            Ok(Some(fd)) => return Ok(Program { path: c.clone(), fd }),
            Ok(None) => {}
            Err(why) => refused.push(format!("{} ({why})", c.display())),
        }
    }
    let looked = candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    if refused.is_empty() {
        return Err(HelperError::Failed(format!(
            "the helper program {program} is not installed (looked in {looked}); reinstall dirseal"
        )));
    }
    Err(HelperError::Failed(format!(
        "the helper program {program} was refused: running as root (or set-user-ID), dirseal runs only a helper that \
         root alone can change, as can every directory and symlink on the way to it from /; refused: {}; \
         install {program} into a root-owned directory no one else can write (PREFIX/libexec, \
         /usr/libexec) or fix the owner and mode named",
        refused.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Instant;

    use dirseal_testfs::needs_root;

    /// The one registration place for programs (data/programs, read by the installers, the
    /// package and the guest tests) and hw/'s binaries name every helper, and nothing else is one.
    #[test]
    fn data_programs_and_hw_name_every_helper() {
        // A new variant fails to compile here until ALL (and so this test) knows it.
        for h in Helper::ALL {
            match h {
                Helper::Tpm2 | Helper::Fido2 => {}
            }
        }
        let listed: Vec<&str> = include_str!("../../../data/programs")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() == 4 && f[2] == "helper")
            .map(|f| f[0])
            .collect();
        assert_eq!(listed, Helper::ALL.map(Helper::program), "data/programs' helper lines");
        let hw = include_str!("../../../hw/Cargo.toml");
        for h in Helper::ALL {
            assert!(
                hw.contains(&format!("name = \"{}\"", h.program())),
                "hw/Cargo.toml has no [[bin]] {}",
                h.program()
            );
        }
    }

    /// A directory root alone can change from / down, for stand-in helpers: beside the test
    /// binary (target/PROFILE), as /tmp is everyone's.
    fn trusted_dir() -> tempfile::TempDir {
        let exe = std::env::current_exe().unwrap();
        let base = exe.parent().unwrap().parent().unwrap();
        let d = tempfile::Builder::new().prefix("helper-test").tempdir_in(base).unwrap();
        if let Err(e) = open_trusted(d.path()) {
            panic!("these tests need a directory root alone can change, and {} is not: {e}", d.path().display());
        }
        d
    }

    /// A shell script at `path`, owned by `uid`, that greets as a helper of this release and then
    /// runs `rest`.
    fn script(path: &Path, rest: &str, uid: u32) {
        let mut s = String::from("#!/bin/sh\nprintf '");
        for b in (HELLO.len() as u32).to_le_bytes() {
            s += &format!("\\{b:03o}");
        }
        s += HELLO;
        s += "'\n";
        s += rest;
        s += "\n";
        std::fs::write(path, s).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    }

    fn dir(path: &Path, mode: u32, uid: u32) {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    }

    fn refused(r: Result<Session, HelperError>) -> String {
        match r {
            Err(HelperError::Failed(e)) => e,
            Err(e) => panic!("{e:?}"),
            Ok(s) => panic!("{} should have been refused", s.path.display()),
        }
    }

    /// The processes of group `pgid` that are still running (zombies aside).
    fn live_in_group(pgid: u32) -> Vec<String> {
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
            // pid (comm) state ppid pgrp …; comm may hold anything, hence the last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else { continue };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z" && f[0] != "X" {
                found.push(stat);
            }
        }
        found
    }

    const NOBODY: u32 = 65534;

    #[test]
    fn a_privileged_caller_runs_only_what_root_alone_can_change_from_the_root_down() {
        needs_root!();
        let t = trusted_dir();
        let marker = t.path().join("ran");
        let evil = format!("touch {}", marker.display());
        // Root's script in root's directory runs, also through root's symlink to it.
        dir(&t.path().join("good"), 0o755, 0);
        script(&t.path().join("good/dirseal-tpm2"), "cat >/dev/null", 0);
        drop(
            Session::start_at(Helper::Tpm2, &[t.path().join("good/dirseal-tpm2")]).unwrap_or_else(|e| panic!("{e:?}")),
        );
        std::os::unix::fs::symlink("good/./../good/dirseal-tpm2", t.path().join("link")).unwrap();
        drop(Session::start_at(Helper::Tpm2, &[t.path().join("link")]).unwrap_or_else(|e| panic!("{e:?}")));
        // Root's file in a user's directory, through root's symlink: the user could swap it.
        dir(&t.path().join("user"), 0o755, NOBODY);
        script(&t.path().join("user/dirseal-tpm2"), &evil, 0);
        std::os::unix::fs::symlink("user/dirseal-tpm2", t.path().join("into-user")).unwrap();
        let e = refused(Session::start_at(Helper::Tpm2, &[t.path().join("into-user")]));
        assert!(e.contains("/user is owned by uid 65534") && e.contains("install dirseal-tpm2 into"), "{e}");
        // A sticky directory anyone may write, as /tmp.
        dir(&t.path().join("sticky"), 0o1777, 0);
        script(&t.path().join("sticky/dirseal-tpm2"), &evil, 0);
        let e = refused(Session::start_at(Helper::Tpm2, &[t.path().join("sticky/dirseal-tpm2")]));
        assert!(e.contains("/sticky can be written by its group and everyone (mode 1777)"), "{e}");
        // Further up, a root-owned sticky directory (a checkout under /tmp) is no way in: the
        // root-owned directory below it cannot be swapped by anyone else.
        dir(&t.path().join("sticky/sub"), 0o755, 0);
        script(&t.path().join("sticky/sub/dirseal-tpm2"), "", 0);
        assert!(open_trusted(&t.path().join("sticky/sub/dirseal-tpm2")).unwrap().is_some());
        // A directory someone else made in it is theirs: refused.
        dir(&t.path().join("sticky/theirs"), 0o755, 65534);
        script(&t.path().join("sticky/theirs/dirseal-tpm2"), "", 0);
        let e = open_trusted(&t.path().join("sticky/theirs/dirseal-tpm2")).unwrap_err();
        assert!(e.contains("/sticky/theirs is owned by uid 65534"), "{e}");
        // A user's symlink, even to root's file.
        std::os::unix::fs::symlink("good/dirseal-tpm2", t.path().join("users-link")).unwrap();
        std::os::unix::fs::lchown(t.path().join("users-link"), Some(NOBODY), Some(NOBODY)).unwrap();
        let e = refused(Session::start_at(Helper::Tpm2, &[t.path().join("users-link")]));
        assert!(e.contains("users-link is a symlink owned by uid 65534"), "{e}");
        // A directory on the way that is not root's: the caller's check starts at /.
        dir(&t.path().join("mid"), 0o755, NOBODY);
        dir(&t.path().join("mid/sub"), 0o755, 0);
        script(&t.path().join("mid/sub/dirseal-tpm2"), &evil, 0);
        let e = refused(Session::start_at(Helper::Tpm2, &[t.path().join("mid/sub/dirseal-tpm2")]));
        assert!(e.contains("/mid is owned by uid 65534"), "{e}");
        assert!(!marker.exists(), "a refused helper ran");
    }

    /// Issue 41, item 3: a root-owned symlink into a user's directory, where the user swaps root's
    /// helper and their own script (rename-exchange) while root checks and starts it.
    #[test]
    fn a_helper_swapped_under_the_check_never_runs_as_root() {
        needs_root!();
        let t = trusted_dir();
        let marker = t.path().join("ran");
        let user = t.path().join("user");
        dir(&user, 0o755, NOBODY);
        script(&user.join("helper"), "cat >/dev/null", 0);
        script(&user.join("evil"), &format!("touch {}", marker.display()), NOBODY);
        std::os::unix::fs::symlink(user.join("helper"), t.path().join("dirseal-tpm2")).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, user) = (stop.clone(), user.clone());
            std::thread::spawn(move || {
                let d = rustix::fs::open(&user, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    rustix::fs::renameat_with(&d, "helper", &d, "evil", rustix::fs::RenameFlags::EXCHANGE).unwrap();
                    // Pauses of varying length, so that the swaps do not fall into step with
                    // the lookups.
                    n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    for _ in 0..(n >> 20) % 4096 {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut errors = Vec::new();
        for _ in 0..300 {
            match Session::start_at(Helper::Tpm2, &[t.path().join("dirseal-tpm2")]) {
                Ok(s) => drop(s),
                Err(HelperError::Failed(e)) => errors.push(e),
                Err(e) => panic!("{e:?}"),
            }
            if marker.exists() {
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(!marker.exists(), "the user's script ran as root");
        assert_eq!(errors.len(), 300, "every try must be refused");
        assert!(errors[0].contains("/user is owned by uid 65534"), "{}", errors[0]);
    }

    /// Issue 41, item 4: a helper whose child keeps its stdout (and stderr) open.
    #[test]
    fn a_helper_that_leaves_a_child_behind_is_stopped_with_it_in_time() {
        needs_root!();
        let t = trusted_dir();
        // Hangs, its child holding the pipes: the call times out.
        let hangs = t.path().join("hangs");
        script(&hangs, "sleep 30 &\nwait", 0);
        let mut s = Session::start_at(Helper::Fido2, std::slice::from_ref(&hangs)).unwrap_or_else(|e| panic!("{e:?}"));
        let group = s.pid();
        let t0 = Instant::now();
        match s.call::<_, u8>(&0u8, Duration::from_secs(1)) {
            Err(HelperError::Failed(e)) => assert!(e.contains("did not answer within 1 s"), "{e}"),
            r => panic!("{:?}", r.err()),
        }
        assert!(t0.elapsed() < Duration::from_secs(4), "returned after {:?}", t0.elapsed());
        drop(s);
        wait_for_empty_group(group);
        // Ends, its child holding the pipes: the call fails with the helper's own exit.
        let ends = t.path().join("ends");
        script(&ends, "sleep 30 &\nexit 3", 0);
        let mut s = Session::start_at(Helper::Fido2, std::slice::from_ref(&ends)).unwrap_or_else(|e| panic!("{e:?}"));
        let group = s.pid();
        // Lets the helper exit first, so that the write meets a closed pipe.
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        match s.call::<_, u8>(&0u8, Duration::from_secs(10)) {
            Err(HelperError::Failed(e)) => assert!(e.contains("ended (exit status: 3)"), "{e}"),
            r => panic!("{:?}", r.err()),
        }
        assert!(t0.elapsed() < Duration::from_secs(4), "returned after {:?}", t0.elapsed());
        drop(s);
        wait_for_empty_group(group);
    }

    fn wait_for_empty_group(group: u32) {
        let t0 = Instant::now();
        while !live_in_group(group).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(3), "left running: {:?}", live_in_group(group));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Issue 41, item 10, the caller's half: the limit is set between fork and exec and stays
    /// (dumpable is reset by exec; the helper's own half is tested in tests/hwlibs.rs).
    #[test]
    fn a_helper_starts_with_no_core_dumps() {
        needs_root!();
        let t = trusted_dir();
        let p = t.path().join("dirseal-fido2");
        script(&p, "cat >/dev/null", 0);
        let s = Session::start_at(Helper::Fido2, &[p]).unwrap_or_else(|e| panic!("{e:?}"));
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.pid())).unwrap();
        let core = limits.lines().find(|l| l.starts_with("Max core file size")).unwrap();
        assert_eq!(core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(), ["0", "0"], "{core}");
    }

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

//! Conversions started over D-Bus: each runs on its own thread as a job object
//! (`/org/dirseal/Dirseal1/jobs/N`, interface `org.dirseal.Dirseal1.Job`) that emits Progress,
//! Finished and Failed signals and can be cancelled. A job does not depend on the client that
//! started it: it goes on when that client disconnects.
//!
//! Jobs are private: their properties answer only the job's owner and root, and their signals
//! are sent to the owner's and root's connections one by one (unicast), never to the bus at large:
//! file counts and sizes of someone's conversion are theirs.
//!
//! Restarts: while a job runs, a marker (source path, owner uid) sits in the service's run
//! directory. When the service starts, it resumes every marked conversion whose journal is
//! unfinished and whose staging key is still loaded (the service crashed or was restarted, the
//! machine was not). After a reboot the key is gone: the next `Convert` call for that directory,
//! with a protector's secret, resumes it.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dirseal::convert::{
    self, Cancelled, ConvertError, Converted, Direction, Hooks, LiveEvent, MigrateError, Plan, When,
};
use dirseal::decrypt;
use dirseal::ops::{Dirseal, Pick};
use dirseal::ui::{Eta, Progress};
use serde::{Deserialize, Serialize};
use zbus::message::{Header, Message};
use zbus::names::{BusName, InterfaceName, MemberName};
use zbus::object_server::{DispatchResult2, Interface, SignalEmitter};
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};
use zbus::{interface, Connection, ObjectServer};

use crate::auth::Caller;
use crate::ctx::Ctx;
use crate::error::{Error, Kind, Result};
use crate::pick::Enrol;
use crate::registry::Running;
use crate::secrets::Secrets;

const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// Hooks for a step that reports nothing and is never stopped (a plan, a cancel's abort).
pub fn quiet() -> Hooks<'static> {
    static NEVER: AtomicBool = AtomicBool::new(false);
    fn unheard(_: &Progress) {}
    Hooks { progress: &unheard, stop: &NEVER }
}

/// What the service remembers of a running job across its own restarts.
#[derive(Serialize, Deserialize)]
struct Marker {
    source: PathBuf,
    uid: u32,
    /// A decrypt's `keep_protectors`: a resumed decrypt must keep what the caller asked to keep
    /// (absent in records of conversions and of older services: false).
    #[serde(default)]
    keep_protectors: bool,
}

fn marker_path(ctx: &Ctx, source: &Path) -> Result<PathBuf> {
    let workdir = convert::workdir_for(source)?;
    let name = workdir.file_name().ok_or_else(|| Error::failed("work directory has no name"))?;
    Ok(ctx.run_dir.join("jobs").join(name))
}

fn write_marker(ctx: &Ctx, source: &Path, uid: u32, keep_protectors: bool) -> Result<()> {
    let path = marker_path(ctx, source)?;
    let io = |e: dirseal::securefile::SecureFileError| Error::failed(format!("recording the job: {e}"));
    dirseal::securefile::ensure_private_dir(&ctx.run_dir).map_err(io)?;
    dirseal::securefile::ensure_private_dir(&ctx.run_dir.join("jobs")).map_err(io)?;
    let body = serde_json::to_vec(&Marker { source: source.to_path_buf(), uid, keep_protectors })
        .map_err(|e| Error::failed(format!("recording the job: {e}")))?;
    dirseal::securefile::write_atomic(&path, &body).map_err(io)
}

fn remove_marker(ctx: &Ctx, source: &Path) {
    if let Ok(p) = marker_path(ctx, source) {
        let _ = std::fs::remove_file(p);
    }
}

/// The job object on the bus (served as [`PrivateJob`]).
pub struct Job {
    source: String,
    owner: u32,
    stop: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    state: Arc<Mutex<String>>,
}

impl Job {
    /// The job's owner or root; anyone else is refused, as for Cancel.
    async fn check_reader(&self, conn: &Connection, hdr: Option<&Header<'_>>) -> zbus::fdo::Result<()> {
        let denied = |m: String| zbus::fdo::Error::AccessDenied(m);
        let hdr = hdr.ok_or_else(|| denied("no caller to authorize".into()))?;
        let caller = Caller::of(conn, hdr).await.map_err(|e| denied(e.message))?;
        if caller.uid == 0 || caller.uid == self.owner {
            return Ok(());
        }
        Err(denied(format!("this conversion belongs to uid {}; only they or root may read it", self.owner)))
    }
}

#[interface(name = "org.dirseal.Dirseal1.Job")]
impl Job {
    // The properties answer only the job's owner and root: [`PrivateJob`] checks the caller
    // before it asks these.

    /// The directory being converted.
    #[zbus(property)]
    fn dir(&self) -> String {
        self.source.clone()
    }

    /// The uid of the user the conversion runs for.
    #[zbus(property)]
    fn owner(&self) -> u32 {
        self.owner
    }

    /// "running", then the final state: "done", "swapped" (backup kept), "aborted" (cancelled:
    /// the directory is as it was), "interrupted" (the service stopped; it resumes), "failed".
    /// A live conversion passes through "caught up" (waiting for the owner's logout),
    /// "committing" and "deferred" (a commit put off; it catches up and waits again).
    #[zbus(property)]
    fn state(&self) -> String {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops the conversion at its next checkpoint and, before the swap, aborts it (a copy is
    /// removed, a move's files are moved back) so the directory stays as it was. Only its owner or
    /// root may cancel it.
    async fn cancel(
        &self,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<()> {
        let caller = Caller::of(conn, &hdr).await?;
        if !caller.is_root() && caller.uid != self.owner {
            return Err(Error::denied(format!(
                "this conversion of {} belongs to uid {}; only they or root may cancel it",
                self.source, self.owner
            )));
        }
        crate::log::line(&format!("Cancel({}) by uid {}", self.source, caller.uid));
        self.cancelled.store(true, Ordering::SeqCst);
        self.stop.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Where the conversion is: `phase` ("scanning", "copying", "verifying", "moving",
    /// "swapping", "disposing", "aborting", "moving back", "rolling back"), bytes and entries done and in total, and an estimate of the seconds left
    /// in this phase (-1 while unknown). At most four per second, and one at each phase change.
    #[zbus(signal)]
    async fn progress(
        emitter: &SignalEmitter<'_>,
        phase: &str,
        bytes_done: u64,
        bytes_total: u64,
        files_done: u64,
        files_total: u64,
        eta_seconds: i64,
    ) -> zbus::Result<()>;

    /// The conversion ended: `state` as the State property, with the entries and bytes copied and
    /// the directory's policy.
    #[zbus(signal)]
    async fn finished(
        emitter: &SignalEmitter<'_>,
        state: &str,
        files: u64,
        bytes: u64,
        policy: &str,
    ) -> zbus::Result<()>;

    /// A live conversion's commit was put off (`reason`: the owner logged back in, a program
    /// used the directory): the job catches up and waits for the next logout.
    #[zbus(signal)]
    async fn deferred(emitter: &SignalEmitter<'_>, reason: &str) -> zbus::Result<()>;

    /// The conversion stopped on an error: its D-Bus error name and the message, which says what
    /// to do next (nothing is lost; `Convert` again resumes).
    #[zbus(signal)]
    async fn failed(emitter: &SignalEmitter<'_>, error: &str, message: &str) -> zbus::Result<()>;
}

/// [`Job`] as served: the one place its properties are guarded. `Get` and `GetAll` are refused
/// to anyone but the job's owner and root before the generated code answers (a guard in each
/// getter would leave zbus 5's generated `GetAll` answering another user an empty dictionary
/// where `Get` says AccessDenied); everything else goes to the generated code. (zbus calls its
/// `Interface` trait unstable: it is re-checked when zbus is upgraded.)
pub struct PrivateJob(Job);

#[async_trait::async_trait]
impl Interface for PrivateJob {
    fn name() -> InterfaceName<'static> {
        <Job as Interface>::name()
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        self.0.spawn_tasks_for_methods()
    }

    async fn get(
        &self,
        property_name: &str,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<zbus::fdo::Result<OwnedValue>> {
        // None: no such property, whoever asks (zbus answers UnknownProperty).
        let value = self.0.get(property_name, server, connection, header, emitter).await?;
        Some(self.0.check_reader(connection, header).await.and(value))
    }

    async fn get_all(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> zbus::fdo::Result<HashMap<String, OwnedValue>> {
        self.0.check_reader(connection, header).await?;
        self.0.get_all(server, connection, header, emitter).await
    }

    fn set<'call>(
        &'call self,
        property_name: &'call str,
        value: &'call Value<'_>,
        server: &'call ObjectServer,
        connection: &'call Connection,
        header: Option<&'call Header<'_>>,
        emitter: &'call SignalEmitter<'_>,
    ) -> DispatchResult2<'call> {
        self.0.set(property_name, value, server, connection, header, emitter)
    }

    async fn set_mut(
        &mut self,
        property_name: &str,
        value: &Value<'_>,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<zbus::fdo::Result<()>> {
        self.0.set_mut(property_name, value, server, connection, header, emitter).await
    }

    fn call<'call>(
        &'call self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult2<'call> {
        self.0.call(server, connection, msg, name)
    }

    /// [`Job`] has no `&mut self` method, so its generated `call` never asks for this one.
    fn call_mut<'call>(
        &'call mut self,
        _: &'call ObjectServer,
        _: &'call Connection,
        _: &'call Message,
        _: MemberName<'call>,
    ) -> DispatchResult2<'call> {
        DispatchResult2::NotFound
    }

    fn introspect_to_writer(&self, writer: &mut dyn std::fmt::Write, level: usize) {
        self.0.introspect_to_writer(writer, level)
    }
}

/// Who receives a job's signals: each connection of its owner and of root, addressed one by one.
struct Audience {
    conn: Connection,
    path: OwnedObjectPath,
    owner: u32,
    /// Unique names seen and their uids (a unique name is never reused on a bus).
    uids: Mutex<HashMap<String, u32>>,
}

impl Audience {
    /// The unique names of the owner's and root's connections now on the bus, but ours.
    fn recipients(&self) -> Vec<String> {
        let Ok(dbus) = zbus::blocking::fdo::DBusProxy::new(&zbus::blocking::Connection::from(self.conn.clone())) else {
            return Vec::new();
        };
        let Ok(names) = dbus.list_names() else { return Vec::new() };
        let ours = self.conn.unique_name().map(|n| n.to_string());
        let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        let live: Vec<String> =
            names.iter().map(|n| n.to_string()).filter(|n| n.starts_with(':') && Some(n) != ours.as_ref()).collect();
        uids.retain(|n, _| live.contains(n));
        let mut out = Vec::new();
        for n in live {
            let uid = match uids.get(&n) {
                Some(u) => *u,
                None => {
                    let Ok(bus) = BusName::try_from(n.as_str()) else { continue };
                    let Ok(u) = dbus.get_connection_unix_user(bus) else { continue };
                    uids.insert(n.clone(), u);
                    u
                }
            };
            if uid == 0 || uid == self.owner {
                out.push(n);
            }
        }
        out
    }

    /// Sends one signal (`send` emits it on the emitter it is given) to each recipient.
    fn send(&self, send: impl Fn(&SignalEmitter<'_>) -> zbus::Result<()>) {
        for n in self.recipients() {
            let Ok(to) = BusName::try_from(n.as_str()) else { continue };
            if let Ok(e) = SignalEmitter::new(&self.conn, self.path.as_ref()) {
                let _ = send(&e.set_destination(to));
            }
        }
    }
}

/// Throttled progress signals with the library's ETA for the current phase.
struct Reporter<'a> {
    audience: &'a Audience,
    /// When the last signal went out, for which phase, and the estimate.
    last: Mutex<(Option<(Instant, String)>, Eta)>,
}

impl Reporter<'_> {
    fn report(&self, p: &Progress) {
        let eta;
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let (sent, estimate) = &mut *last;
            eta = estimate.seconds(p);
            let same_phase = sent.as_ref().is_some_and(|(_, ph)| *ph == p.phase);
            if same_phase && sent.as_ref().is_some_and(|(t, _)| t.elapsed() < PROGRESS_EVERY) {
                return;
            }
            *sent = Some((Instant::now(), p.phase.clone()));
        }
        self.audience.send(|e| {
            zbus::block_on(Job::progress(e, &p.phase, p.bytes_done, p.bytes_total, p.files_done, p.files_total, eta))
        });
    }
}

/// What a job needs to run: a checked plan with what its kind takes, and the call's secrets.
pub struct Start {
    pub ds: Dirseal,
    pub work: Work,
    pub secrets: Secrets,
    pub owner: u32,
}

/// A conversion (new or resumed) with the protector it uses ([`convert::Plan::run`]).
pub enum Work {
    Convert(Plan, Enrol),
    /// A decrypt (new or resumed) with the protector that (re)loads its key and whether the
    /// protectors only it used are kept.
    Decrypt(decrypt::Plan, Pick, bool),
}

impl Work {
    fn source(&self) -> &Path {
        match self {
            Work::Convert(p, _) => p.source(),
            Work::Decrypt(p, _, _) => p.source(),
        }
    }
}

/// When a conversion's plan runs.
fn when(plan: &Plan) -> When {
    match plan {
        Plan::New(p) => p.options.when,
        Plan::Resume(p) => p.options.when,
    }
}

/// Puts the job object on the bus and starts its thread; returns the object path.
pub fn spawn(ctx: &Arc<Ctx>, conn: &Connection, start: Start) -> Result<OwnedObjectPath> {
    let n = ctx.jobs.number();
    let path = OwnedObjectPath::try_from(format!("/org/dirseal/Dirseal1/jobs/{n}"))
        .map_err(|e| Error::failed(format!("job path: {e}")))?;
    let source = start.work.source().to_path_buf();
    let start_owner = start.owner;
    let stop = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::new(AtomicBool::new(false));
    let state = Arc::new(Mutex::new("running".to_string()));
    let job = Job {
        source: source.display().to_string(),
        owner: start.owner,
        stop: Arc::clone(&stop),
        cancelled: Arc::clone(&cancelled),
        state: Arc::clone(&state),
    };
    // Recorded before the job exists, so a job on the bus always has its record.
    let keep_protectors = matches!(start.work, Work::Decrypt(_, _, true));
    write_marker(ctx, &source, start.owner, keep_protectors)?;
    if let Err(e) = zbus::block_on(conn.object_server().at(path.as_ref(), PrivateJob(job))) {
        remove_marker(ctx, &source);
        return Err(e.into());
    }
    let (ctx2, conn2, path2, stop2) = (Arc::clone(ctx), conn.clone(), path.clone(), Arc::clone(&stop));
    let thread = std::thread::Builder::new()
        .name(format!("job {n}"))
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| run(&ctx2, &conn2, &path2, start, &stop2, &cancelled, &state));
            if let Err(p) = std::panic::catch_unwind(run) {
                let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_default();
                crate::log::line(&format!("job {} panicked: {msg}", path2.as_str()));
            }
        })
        .map_err(|e| Error::failed(format!("starting the job thread: {e}")))?;
    ctx.jobs.add(Running { source, owner: start_owner, path: path.clone(), stop, thread });
    Ok(path)
}

fn run(
    ctx: &Ctx,
    conn: &Connection,
    path: &OwnedObjectPath,
    start: Start,
    stop: &AtomicBool,
    cancelled: &AtomicBool,
    state: &Mutex<String>,
) {
    let Start { mut ds, work, mut secrets, owner } = start;
    let source = work.source().to_path_buf();
    let audience = Audience { conn: conn.clone(), path: path.clone(), owner, uids: Mutex::default() };
    let reporter = Reporter { audience: &audience, last: Mutex::default() };
    let progress = |p: &Progress| reporter.report(p);
    let hooks = Hooks { progress: &progress, stop };
    let decrypting = matches!(work, Work::Decrypt(..));
    let decrypted =
        |d: decrypt::Decrypted| Converted { outcome: d.outcome, recovery_key_saved: None, scheduled: false };
    let set = |s: &str| *state.lock().unwrap_or_else(|e| e.into_inner()) = s.to_string();
    let live = matches!(&work, Work::Convert(plan, _) if when(plan) == When::Live);
    let result = match work {
        Work::Convert(plan, enrol) => plan.run(&mut ds, enrol.choice(), &mut secrets, &hooks),
        Work::Decrypt(plan, pick, keep) => plan.run(&mut ds, pick, keep, &mut secrets, &hooks).map(decrypted),
    };
    // Live: prepared (or caught up again); the background part runs in this thread, the
    // service being long-lived, until the commit.
    let result = match result {
        Ok(c) if live && convert::unfinished(c.outcome.state) => {
            let on = |e: LiveEvent<'_>| match e {
                LiveEvent::CaughtUp { .. } => set("caught up"),
                LiveEvent::Committing => set("committing"),
                LiveEvent::Deferred(reason) => {
                    set("deferred");
                    audience.send(|e| zbus::block_on(Job::deferred(e, reason)));
                }
            };
            convert::run_live(&ds, &source, &mut secrets, &hooks, &on)
        }
        other => other,
    };
    let call = if decrypting { "Decrypt" } else { "Convert" };
    let log =
        |what: &str| crate::log::line(&format!("job {} ({}, uid {owner}): {what}", path.as_str(), source.display()));
    let finished = |word: &str, files: u64, bytes: u64, token: &str| {
        audience.send(|e| zbus::block_on(Job::finished(e, word, files, bytes, token)));
    };
    match result {
        Ok(Converted { outcome, scheduled, .. }) => {
            // Scheduled for the next boot: the journal waits there, nothing was copied.
            let word = if scheduled { "scheduled".to_string() } else { outcome.state.to_string() };
            set(&word);
            log(&word);
            remove_marker(ctx, &source);
            finished(&word, outcome.files, outcome.bytes, &outcome.token);
        }
        Err(ConvertError::Migrate(MigrateError::Interrupted { state: at })) if cancelled.load(Ordering::SeqCst) => {
            // The library decides: before the swap it aborts (a move's files move back), after it
            // the conversion is left to resume.
            let idle = AtomicBool::new(false);
            let hooks = Hooks { progress: &progress, stop: &idle };
            let cancelled = if decrypting {
                decrypt::cancel(&mut ds, &source, at, &mut secrets, &hooks)
            } else {
                convert::cancel(&ds, &source, at, &mut secrets, &hooks)
            };
            match cancelled {
                Ok(Cancelled::Aborted(o)) => {
                    set("aborted");
                    log("cancelled; aborted, the directory is as it was");
                    remove_marker(ctx, &source);
                    finished("aborted", o.files, o.bytes, &o.token);
                }
                Ok(Cancelled::PastSwap(_)) => {
                    set("interrupted");
                    log(&format!("cancelled after the swap; it resumes with the next {call} call"));
                    let msg = format!(
                        "the conversion was past the swap (the directory is {} and whole) and cannot be cancelled; call {call} again to finish it",
                        if decrypting { "plaintext" } else { "encrypted" }
                    );
                    audience.send(|e| zbus::block_on(Job::failed(e, "org.dirseal.Dirseal1.Error.Failed", &msg)));
                }
                Err(err) => fail(ctx, &source, &audience, &set, &log, Error::from(err)),
            }
        }
        Err(ConvertError::Migrate(MigrateError::Interrupted { .. })) if ctx.jobs.shutting_down() => {
            // The marker stays: the next start of the service resumes it.
            set("interrupted");
            log("interrupted by the service stopping; it resumes when the service starts");
        }
        Err(e) => fail(ctx, &source, &audience, &set, &log, Error::from(e)),
    }
}

fn fail(ctx: &Ctx, source: &Path, audience: &Audience, set: &dyn Fn(&str), log: &dyn Fn(&str), err: Error) {
    set("failed");
    log(&err.to_string());
    remove_marker(ctx, source);
    audience.send(|e| zbus::block_on(Job::failed(e, err.kind.name(), &err.message)));
}

/// The unfinished conversion or decrypt `m` records, planned again to run without a secret: its
/// staging key must still be loaded.
fn resumable(ds: &Dirseal, m: &Marker) -> Result<Work> {
    let decrypting =
        convert::status(&m.source)?.is_some_and(|v| v.direction == Direction::Decrypt && convert::unfinished(v.state));
    let (ready, call) = if decrypting {
        let plan =
            decrypt::plan(ds, &m.source, Default::default(), Pick::default(), &mut Secrets::default(), &quiet())?;
        let ready = match plan {
            decrypt::Plan::Resume(p) => {
                (!p.key.needed).then(|| Work::Decrypt(decrypt::Plan::Resume(p), Pick::default(), m.keep_protectors))
            }
            decrypt::Plan::New(_) => return Err(Error::new(Kind::NotFound, "no unfinished decrypt is recorded")),
        };
        (ready, "Decrypt")
    } else {
        // A live one goes on live (its background part), not straight to a commit.
        let live = convert::status(&m.source)?.is_some_and(|v| v.live);
        let options = convert::Options { when: if live { When::Live } else { When::Now }, ..Default::default() };
        let ready = match convert::plan(ds, &m.source, options, &quiet())? {
            Plan::Resume(p) => p.key.is_none().then(|| Work::Convert(Plan::Resume(p), Enrol::none_named())),
            Plan::New(_) => return Err(Error::new(Kind::NotFound, "no unfinished conversion is recorded")),
        };
        (ready, "Convert")
    };
    let locked = format!("its staging key is not loaded: {call} with a secret resumes it");
    ready.ok_or_else(|| Error::new(Kind::NotFound, locked))
}

/// At start: resumes the conversions this service was running when it last stopped, where the
/// staging key is still loaded. Others wait for a `Convert` call with a secret.
pub fn resume_recorded(ctx: &Arc<Ctx>, conn: &Connection) {
    let Ok(entries) = std::fs::read_dir(ctx.run_dir.join("jobs")) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let marker = dirseal::securefile::read_private(&path, 64 * 1024)
            .ok()
            .and_then(|b| serde_json::from_slice::<Marker>(&b).ok());
        let Some(m) = marker else {
            crate::log::line(&format!("ignoring unreadable job record {}", path.display()));
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let r = (|| -> Result<OwnedObjectPath> {
            let ds = ctx.open()?;
            let work = resumable(&ds, &m)?;
            spawn(ctx, conn, Start { ds, work, secrets: Secrets::default(), owner: m.uid })
        })();
        match r {
            Ok(job) => {
                crate::log::line(&format!("resumed the conversion of {} as {}", m.source.display(), job.as_str()))
            }
            Err(e) => {
                crate::log::line(&format!("not resuming the conversion of {}: {e}", m.source.display()));
                if e.kind != Kind::NotFound || !e.message.contains("staging key") {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
}

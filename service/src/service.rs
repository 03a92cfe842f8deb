//! `org.dirseal.Dirseal1` at `/org/dirseal/Dirseal1`: the operations of [`dirseal::ops`] for callers
//! on the system bus, each authorized against the caller's uid (docs/dbus.md).
//!
//! Every method: learn the caller's uid from the bus, count the call against the caller's cap on
//! calls in flight, then run the work on a blocking thread inside `catch_unwind`, and log one line
//! naming the method, the caller and the outcome — never a secret.
//!
//! Nothing shared is held while the service waits on a caller: a method reads its secrets (up to
//! [`crate::fdio`]'s size and time limits) first, and only then takes the one-at-a-time lock
//! ([`Ctx::one_at_a_time`]) for the work that needs it (a KDF — Argon2 is memory-hard: parallel
//! calls must not multiply its memory — or a change to the keystore). Calls that only read
//! (GetStatus, ListProtectors, GetTpmTriesLeft, PlanConvert, job properties) never take it.
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dirseal::convert::{State, Summary, When};
use dirseal::keystore::{KeystoreError, PolicyRecord};
use dirseal::ops::{self, Dirseal, NewProtector, Pick};
use dirseal::protector::{KindOptions, NewKind};
use dirseal::secret::Passphrase;
use futures_lite::FutureExt;
use zbus::message::Header;
use zbus::zvariant::{self, OwnedValue, SerializeDict, Type};
use zbus::{interface, Connection};

use crate::auth::Caller;
use crate::ctx::Ctx;
use crate::error::{Error, Kind, Result};
use crate::fdio::{read_secret, write_secret};
use crate::jobs;
use crate::pick::{self, choose, owner_of, parse_protector_id, pin_try, Enrol};
use crate::secrets::Secrets;

/// An a{sv} dictionary: a call's options, a plan.
type Dict = HashMap<String, OwnedValue>;

pub const BUS_NAME: &str = "org.dirseal.Dirseal1";
pub const OBJECT_PATH: &str = "/org/dirseal/Dirseal1";

/// One protector as `ListProtectors` and `GetStatus` show it.
#[derive(SerializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct ProtectorInfo {
    id: String,
    name: String,
    kind: String,
    /// Absent for protectors that belong to no user.
    uid: Option<u32>,
    policies: Option<Vec<String>>,
}

impl ProtectorInfo {
    fn of(s: &ops::ProtectorSummary, policies: Option<Vec<String>>) -> ProtectorInfo {
        ProtectorInfo { id: s.id.to_string(), name: s.name.clone(), kind: s.kind.to_string(), uid: s.uid, policies }
    }
}

#[derive(SerializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct Status {
    path: String,
    encrypted: bool,
    /// The policy (kernel key identifier); empty when not encrypted.
    policy: String,
    /// "locked", "unlocked", "partially-locked"; empty when not encrypted.
    key: String,
    managed: bool,
    /// For a portable directory, where its records are on its medium; empty otherwise.
    portable: String,
    protectors: Vec<ProtectorInfo>,
    problems: Vec<String>,
    /// Works, but should be known (a local record shadowed by the medium's, a weak TPM PIN).
    warnings: Vec<String>,
    recovery_key: bool,
    /// State of a recorded conversion ("copying", "done", ...; "scheduled" for the next boot;
    /// "live: ..." for a live one: "live: caught up, waiting for logout", "live: deferred (...)");
    /// empty when none.
    conversion: String,
    /// When the directory is the home of a display manager's autologin user: `MANAGER:CASE`
    /// ("sddm:1", "lightdm:2", "gdm:3"), what the next boot does (docs/pam.md); empty otherwise.
    autologin: String,
}

#[derive(SerializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct BusyInfo {
    pid: u32,
    comm: String,
    uid: u32,
    how: String,
}

#[derive(SerializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct LockInfo {
    locked: bool,
    files_busy: bool,
    other_users: bool,
    busy: Vec<BusyInfo>,
}

fn panic_error(p: Box<dyn std::any::Any + Send>) -> Error {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into());
    Error::failed(format!(
        "internal error in dirsealed ({what}); nothing more was done. Please report it with the service's log"
    ))
}

fn log_outcome<T>(method: &str, caller: &Caller, target: &str, r: &Result<T>) {
    let who = match caller.uid {
        u if u != 0 && caller.is_root() => {
            format!("uid {u} (as administrator: polkit granted {})", crate::auth::MANAGE_ACTION)
        }
        u => format!("uid {u}"),
    };
    let outcome = match r {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    crate::log::outcome(method, caller.uid, &who, target, &outcome);
}

pub struct Service {
    ctx: Arc<Ctx>,
    /// The connection this object is served on: it asks the bus who calls, and jobs emit on it.
    conn: Connection,
}

impl Service {
    pub fn new(ctx: Arc<Ctx>, conn: Connection) -> Service {
        Service { ctx, conn }
    }

    /// Every method's preamble: learns the caller's uid from the bus, then runs `work` on a
    /// blocking thread, one call at a time, with panics caught and the outcome logged.
    async fn call<T, F>(&self, method: &'static str, target: String, hdr: &Header<'_>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<Ctx>, &Caller) -> Result<T> + Send + 'static,
    {
        self.checked(method, target, hdr, |_| Ok(()), move |ctx, caller, ()| work(ctx, caller)).await
    }

    /// [`Service::call`] for a method on a directory: `work` gets `dir` as a path the caller may
    /// act on ([`Caller::directory`]).
    async fn on_dir<T, F>(&self, method: &'static str, dir: String, hdr: &Header<'_>, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<Ctx>, &Caller, PathBuf) -> Result<T> + Send + 'static,
    {
        let target = dir.clone();
        self.checked(method, target, hdr, move |caller| caller.directory(&dir), work).await
    }

    /// The two above: `check` (which may wait for polkit, and so for the caller typing a
    /// password), then `work` with what `check` returned. Neither holds the one-at-a-time lock;
    /// `work` takes it once it has read its secrets.
    async fn checked<T, P, C, F>(
        &self,
        method: &'static str,
        target: String,
        hdr: &Header<'_>,
        check: C,
        work: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        C: FnOnce(&Caller) -> Result<P> + Send + 'static,
        F: FnOnce(&Arc<Ctx>, &Caller, P) -> Result<T> + Send + 'static,
    {
        let ctx = Arc::clone(&self.ctx);
        let fut = async move {
            let caller = Caller::of(&self.conn, hdr).await?;
            let slot = match ctx.admit(caller.uid) {
                Ok(s) => s,
                Err(e) => {
                    let r = Err(e);
                    log_outcome(method, &caller, &target, &r);
                    return r;
                }
            };
            blocking::unblock(move || {
                let _slot = slot;
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let checked = check(&caller)?;
                    work(&ctx, &caller, checked)
                }))
                .unwrap_or_else(|p| Err(panic_error(p)));
                log_outcome(method, &caller, &target, &r);
                r
            })
            .await
        };
        AssertUnwindSafe(fut).catch_unwind().await.unwrap_or_else(|p| Err(panic_error(p)))
    }
}

/// `Convert`'s and `PlanConvert`'s options, and the `protector` option (empty when absent),
/// checked for `caller`: only root may force a `what` ("conversion", "decrypt").
fn convert_options(options: &Dict, caller: &Caller, what: &str) -> Result<(dirseal::convert::Options, String)> {
    let mut o = dirseal::convert::Options { recovery_key: Some(false), ..Default::default() };
    let mut protector = String::new();
    let bad = |k: &str, t: &str| Error::invalid(format!("option {k} must be of type {t}"));
    for (k, v) in options {
        match k.as_str() {
            "protector" => {
                protector = String::try_from(v.try_clone().map_err(|_| bad(k, "s"))?).map_err(|_| bad(k, "s"))?
            }
            "keep_backup" => o.keep_backup = bool::try_from(v).map_err(|_| bad(k, "b"))?,
            "wipe" => o.wipe = bool::try_from(v).map_err(|_| bad(k, "b"))?,
            "force" => o.force = bool::try_from(v).map_err(|_| bad(k, "b"))?,
            "mode" => {
                let m = String::try_from(v.try_clone().map_err(|_| bad(k, "s"))?).map_err(|_| bad(k, "s"))?;
                o.mode = m.parse().map_err(|e| Error::invalid(format!("option mode: {e}")))?
            }
            "at_next_boot" | "live" if what == "conversion" => {
                let when = if k == "live" { When::Live } else { When::AtNextBoot };
                if bool::try_from(v).map_err(|_| bad(k, "b"))? {
                    if o.when != When::Now && o.when != when {
                        return Err(Error::invalid("options at_next_boot and live exclude each other"));
                    }
                    o.when = when
                }
            }
            other => {
                return Err(Error::invalid(format!(
                    "unknown option {other:?}; known: protector, keep_backup, wipe, force, mode{}",
                    if what == "conversion" { ", at_next_boot, live" } else { "" }
                )))
            }
        }
    }
    if o.force && !caller.may_administer() {
        return Err(Error::denied(format!("only root may force a {what} of a directory in use")));
    }
    // A user is logged in by definition: the library's busy check then asks only that nothing
    // has the directory open.
    o.owner_asks = !caller.is_root();
    Ok((o, protector))
}

/// An option holding a file descriptor (`h`).
fn fd_option(v: OwnedValue, name: &str) -> Result<OwnedFd> {
    let bad = || Error::invalid(format!("option {name} must be of type h (a file descriptor)"));
    let fd = zvariant::Fd::try_from(v).map_err(|_| bad())?;
    OwnedFd::try_from(fd).map_err(|_| bad())
}

/// `Decrypt`'s and `PlanDecrypt`'s options: convert's, `protector`, and `keep_protectors` (the
/// library refuses `wipe` for a decrypt).
fn decrypt_options(options: &Dict, caller: &Caller) -> Result<(dirseal::convert::Options, String, bool)> {
    let mut rest = options.clone();
    let keep = match rest.remove("keep_protectors") {
        Some(v) => bool::try_from(&v).map_err(|_| Error::invalid("option keep_protectors must be of type b"))?,
        None => false,
    };
    let (o, protector) = convert_options(&rest, caller, "decrypt")?;
    Ok((o, protector, keep))
}

/// Convert's and Decrypt's course once their options are checked: read the secret, then, under
/// the one-at-a-time lock, answer the job already running for the directory, or admit the
/// caller's new one and start what `plan` makes of the secret.
fn start_job(
    ctx: &Arc<Ctx>,
    bus: &Connection,
    caller: &Caller,
    dir: &Path,
    secret: zvariant::OwnedFd,
    plan: impl FnOnce(&Dirseal, Passphrase) -> Result<(jobs::Work, Secrets)>,
) -> Result<zvariant::OwnedObjectPath> {
    let secret = read_secret(secret.into(), "secret")?;
    let (_one, ds) = ctx.open_alone()?;
    let source = dirseal::convert::absolute(dir)?;
    if let Some(job) = ctx.jobs.running_for(&source) {
        return Ok(job);
    }
    if !caller.is_root() {
        ctx.jobs.admit(caller.uid)?;
    }
    let (work, secrets) = plan(&ds, secret)?;
    jobs::spawn(ctx, bus, jobs::Start { ds, work, secrets, owner: owner_of(dir).unwrap_or(0) })
}

/// PlanConvert's and PlanDecrypt's answer: a new plan's summary, or for an unfinished one (no
/// summary) its path and the `state` its journal records.
fn plan_reply(summary: Option<Summary>, source: &Path, state: Option<State>) -> Result<Dict> {
    let json = match summary {
        Some(s) => serde_json::to_value(s).map_err(|e| Error::failed(e.to_string()))?,
        None => serde_json::json!({ "path": source, "state": state.map(|s| s.to_string()) }),
    };
    match to_dbus(&json).map(Dict::try_from) {
        Some(Ok(m)) => Ok(m),
        _ => Err(Error::failed("the plan could not be expressed as a{sv}")),
    }
}

/// A JSON value (the library's serialized summary) as D-Bus values: objects become `a{sv}`, lists
/// of words `as` (e.g. `kept_flags`), nulls and other lists are left out.
fn to_dbus(v: &serde_json::Value) -> Option<OwnedValue> {
    use serde_json::Value as J;
    use zvariant::Value as V;
    let v = match v {
        J::Array(a) => {
            let words: Option<Vec<String>> = a.iter().map(|w| w.as_str().map(str::to_owned)).collect();
            V::from(words?)
        }
        J::Null => return None,
        J::Bool(b) => V::from(*b),
        J::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => V::from(u),
            (None, Some(i)) => V::from(i),
            _ => V::from(n.as_f64().unwrap_or_default()),
        },
        J::String(s) => V::from(s.clone()),
        J::Object(m) => {
            let d: Dict = m.iter().filter_map(|(k, v)| Some((k.clone(), to_dbus(v)?))).collect();
            return OwnedValue::try_from(V::from(d)).ok();
        }
    };
    OwnedValue::try_from(v).ok()
}

/// A check's answer: whether the secret was right; other errors stay errors.
fn valid<T, E: Into<Error>>(r: std::result::Result<T, E>) -> Result<bool> {
    match r.map_err(Into::into) {
        Ok(_) => Ok(true),
        Err(e) if e.kind == Kind::IncorrectSecret => Ok(false),
        Err(e) => Err(e),
    }
}

/// GetStatus's `autologin`: the display managers that log in the user whose home `path` is, each
/// with the case of the next boot; a configuration that cannot be read says nothing.
fn autologin_of(ds: &dirseal::Dirseal, path: &std::path::Path) -> String {
    let Ok(list) = ds.autologin_status(std::path::Path::new("/")) else { return String::new() };
    let here = std::fs::canonicalize(path).ok();
    list.iter()
        .filter(|s| s.home.as_deref().and_then(|h| std::fs::canonicalize(h).ok()) == here && here.is_some())
        .map(|s| format!("{}:{}", s.configured.manager.name(), s.next_boot))
        .collect::<Vec<_>>()
        .join(",")
}

#[interface(name = "org.dirseal.Dirseal1")]
impl Service {
    /// Encryption state of a directory, its key status, protectors, recovery key and conversion.
    #[zbus(out_args("status"))]
    async fn get_status(&self, #[zbus(header)] hdr: Header<'_>, dir: String) -> Result<Status> {
        self.on_dir("GetStatus", dir, &hdr, move |ctx, _caller, path| {
            let ds = ctx.open_existing()?;
            let st = ds.dir_status(&path)?;
            // Scheduled for the next boot reads so (its journal would say an interrupted copy).
            let scheduled =
                matches!(dirseal::convert::boot_state(&ds, &path), Ok(Some(dirseal::scheduled::BootState::Pending(_))));
            // A live conversion says where it stands ("live: caught up, waiting for logout").
            let live = dirseal::convert::live_status(&ds, &path).ok().flatten();
            let conversion = dirseal::convert::absolute(&path)
                .ok()
                .and_then(|abs| dirseal::convert::status(&abs).ok().flatten())
                .map(|v| match &live {
                    Some(l) => l.to_string(),
                    None if scheduled => "scheduled".to_string(),
                    None => v.state.to_string(),
                })
                .unwrap_or_default();
            let recovery_key = st.encrypted && dirseal::recovery::read_blob(&path).is_ok_and(|b| b.is_some());
            Ok(Status {
                path: st.path.display().to_string(),
                encrypted: st.encrypted,
                policy: st.policy.map(|p| p.to_string()).unwrap_or_default(),
                key: st.key.unwrap_or_default().to_string(),
                managed: st.managed,
                portable: st.portable.map(|p| p.display().to_string()).unwrap_or_default(),
                protectors: st.protectors.iter().map(|p| ProtectorInfo::of(p, None)).collect(),
                problems: st.problems,
                warnings: st.warnings,
                recovery_key,
                conversion,
                autologin: autologin_of(&ds, &path),
            })
        })
        .await
    }

    /// Loads the directory's key. `protector` is an id or the name of one of the caller's; empty,
    /// the caller's own protectors are tried in the login order (no typing first, then by name).
    async fn unlock(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        protector: String,
        secret: zvariant::OwnedFd,
    ) -> Result<()> {
        let target = dir.clone();
        // A directory under one of the caller's own (`~/Private`) may be unlocked too.
        self.checked(
            "Unlock",
            target,
            &hdr,
            move |caller| caller.directory_to_unlock(&dir),
            move |ctx, caller, path| {
                let secret = read_secret(secret.into(), "secret")?;
                let (_one, ds) = ctx.open_alone()?;
                if protector.is_empty() && !caller.is_root() {
                    // The caller's own protectors, in the login order for their uid. A TPM PIN the
                    // rule refuses a try now is skipped (the next one is tried); when none could be
                    // tried at all, the refusal is the answer.
                    let (mut refused, mut tried) = (None, 0);
                    let keep = |rec: &dirseal::protector::ProtectorRecord| match pin_try(&ds, caller, Some(rec.id)) {
                        Ok(()) => {
                            tried += 1;
                            true
                        }
                        Err(e) => {
                            refused.get_or_insert(e);
                            false
                        }
                    };
                    let mut secrets = Secrets { current: vec![(None, secret)], ..Secrets::of(caller) };
                    return match ds.unlock_as_where(&path, caller.uid, &mut secrets, keep) {
                        Ok(()) => Ok(()),
                        Err(e @ ops::OpsError::OpensNone { .. }) if tried == 0 => {
                            Err(refused.unwrap_or_else(|| e.into()))
                        }
                        Err(e) => Err(e.into()),
                    };
                }
                let policy = ds.policy_of(&path)?;
                // With escrow required, a key that could not be escrowed is never handed out.
                ds.wants_recovery_key(&path, Some(true), &mut Secrets::of(caller))?;
                let pick = choose(&ds, caller, &policy, &protector, &path)?;
                pin_try(&ds, caller, pick.protector)?;
                ds.unlock(
                    &path,
                    pick,
                    &mut Secrets { current: vec![(pick.protector, secret)], ..Secrets::of(caller) },
                )?;
                Ok(())
            },
        )
        .await
    }

    /// Removes the directory's key; files still open keep it partly unlocked (see `busy`).
    #[zbus(out_args("report"))]
    async fn lock(&self, #[zbus(header)] hdr: Header<'_>, dir: String, all_users: bool) -> Result<LockInfo> {
        self.on_dir("Lock", dir, &hdr, move |ctx, _caller, path| {
            let ds = ctx.open_existing()?;
            let r = ds.lock(&path, all_users)?;
            Ok(LockInfo {
                locked: r.locked,
                files_busy: r.files_busy,
                other_users: r.other_users,
                busy: r
                    .busy
                    .into_iter()
                    .map(|b| BusyInfo { pid: b.pid, comm: b.comm, uid: b.uid, how: b.how })
                    .collect(),
            })
        })
        .await
    }

    /// Encrypts an empty directory. With `protector` empty, `secret` is the password of a new
    /// protector; otherwise it proves that existing protector. Returns (policy, protector).
    #[zbus(out_args("policy", "protector"))]
    async fn encrypt(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        protector: String,
        secret: zvariant::OwnedFd,
    ) -> Result<(String, String)> {
        self.on_dir("Encrypt", dir, &hdr, move |ctx, caller, path| {
            let secret = read_secret(secret.into(), "secret")?;
            let (_one, mut ds) = ctx.open_alone()?;
            let mut secrets = Secrets::of(caller);
            let enrol = Enrol::new(&ds, caller, &path, &protector, "", secret, &mut secrets)?;
            let (policy, _master) = ds.encrypt(&path, enrol.choice(), &mut secrets)?;
            // Invariant: a new policy has exactly the protector it was created with.
            let pid = policy.wrapped.keys().next().map(ToString::to_string).unwrap_or_default();
            Ok((policy.id.to_string(), pid))
        })
        .await
    }

    /// The caller's protectors (root: all), each with the policies it opens.
    #[zbus(out_args("protectors"))]
    async fn list_protectors(&self, #[zbus(header)] hdr: Header<'_>) -> Result<Vec<ProtectorInfo>> {
        self.call("ListProtectors", String::new(), &hdr, move |ctx, caller| {
            let ds = ctx.open_existing()?;
            let ks = ds.keystore();
            let policies: Vec<PolicyRecord> = ks.policies()?.into_iter().filter_map(|(_, p)| p.ok()).collect();
            let mut out = Vec::new();
            for (_, rec) in ks.protectors()? {
                let Ok(rec) = rec else { continue };
                if !caller.owns_protector(&rec) {
                    continue;
                }
                let used = policies.iter().filter(|p| p.wrapped.contains_key(&rec.id)).map(|p| p.id.to_string());
                out.push(ProtectorInfo::of(&ops::ProtectorSummary::of(&rec), Some(used.collect())));
            }
            Ok(out)
        })
        .await
    }

    /// Creates a protector named `name`: by default a password protector with password `secret`.
    /// Options: `kind` (s: "password" or "tpm2"; `secret` is then the PIN), `uid` (u, root only:
    /// whose protector it is; a user's protector is always their own), and the kind's own options
    /// (docs/dbus.md), e.g. `no_pin` (b, tpm2: no PIN, `secret` is ignored). Returns its id.
    #[zbus(out_args("protector"))]
    async fn create_protector(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        name: String,
        secret: zvariant::OwnedFd,
        options: Dict,
    ) -> Result<String> {
        self.call("CreateProtector", name.clone(), &hdr, move |ctx, caller| {
            let mut uid = None;
            let mut kind = dirseal::protector::DEFAULT_KIND.to_string();
            let mut pairs = Vec::new();
            let bad = |o: &str, t: &str| Error::invalid(format!("option {o} must be of type {t}"));
            for (k, v) in &options {
                match k.as_str() {
                    "uid" => uid = Some(u32::try_from(v).map_err(|_| bad("uid", "u"))?),
                    "kind" => {
                        kind = String::try_from(v.try_clone().map_err(|_| bad("kind", "s"))?)
                            .map_err(|_| bad("kind", "s"))?
                    }
                    // The rest is the kind's, as text: it parses and checks its own.
                    other => pairs.push((other.to_string(), option_text(v).ok_or_else(|| bad(other, "b, s or u"))?)),
                }
            }
            if uid.is_some_and(|u| u != caller.uid) && !caller.may_administer() {
                return Err(Error::denied("only root may create a protector for another user"));
            }
            let opts = if caller.may_administer() { KindOptions::new(pairs) } else { KindOptions::untrusted(pairs) };
            let kind = NewKind::named(&kind, opts)?;
            let secret = read_secret(secret.into(), "secret")?;
            let (_one, mut ds) = ctx.open_alone()?;
            let uid = if caller.is_root() { uid } else { Some(caller.uid) };
            let n = NewProtector::for_user(uid, kind, Some(name));
            let (rec, _) = ds.create_protector(&n, &mut Secrets { new: Some(secret), ..Secrets::of(caller) })?;
            Ok(rec.id.to_string())
        })
        .await
    }

    /// Deletes a protector that no policy uses any more.
    async fn remove_protector(&self, #[zbus(header)] hdr: Header<'_>, protector: String) -> Result<()> {
        self.call("RemoveProtector", protector.clone(), &hdr, move |ctx, caller| {
            let id = parse_protector_id(&protector)?;
            let (_one, ds) = ctx.open_alone()?;
            match ds.keystore().protector(&id) {
                Ok(rec) => caller.check_protector(&rec)?,
                // An unreadable file names no owner: only root may remove it.
                Err(KeystoreError::Corrupt { .. }) if caller.may_administer() => {}
                Err(e) => return Err(e.into()),
            }
            ds.remove_protector(&id)?;
            Ok(())
        })
        .await
    }

    /// Lets another protector open the directory, proved by one that already does (`with`, empty:
    /// the caller's own). `new` empty creates a password protector `new_name` with `new_secret`;
    /// otherwise `new_secret` proves that existing protector. Returns the added protector's id.
    #[allow(clippy::too_many_arguments)]
    #[zbus(out_args("protector"))]
    async fn add_protector_to_policy(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        with: String,
        with_secret: zvariant::OwnedFd,
        new: String,
        new_secret: zvariant::OwnedFd,
        new_name: String,
    ) -> Result<String> {
        self.on_dir("AddProtectorToPolicy", dir, &hdr, move |ctx, caller, path| {
            let with_secret = read_secret(with_secret.into(), "with_secret")?;
            let new_secret = read_secret(new_secret.into(), "new_secret")?;
            let (_one, mut ds) = ctx.open_alone()?;
            let policy = ds.policy_of(&path)?;
            let pick = choose(&ds, caller, &policy, &with, &path)?;
            pin_try(&ds, caller, pick.protector)?;
            let mut secrets = Secrets { current: vec![(pick.protector, with_secret)], ..Secrets::of(caller) };
            let enrol = Enrol::new(&ds, caller, &path, &new, &new_name, new_secret, &mut secrets)?;
            // The record the directory was answered from (a portable one's is on its medium).
            let rec = ds.add_protector_to(&policy, pick, enrol.choice(), &mut secrets)?;
            Ok(rec.id.to_string())
        })
        .await
    }

    /// Stops a protector from opening the directory (another usable one must remain).
    async fn remove_protector_from_policy(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        protector: String,
    ) -> Result<()> {
        self.on_dir("RemoveProtectorFromPolicy", dir, &hdr, move |ctx, caller, path| {
            let id = parse_protector_id(&protector)?;
            let (_one, ds) = ctx.open_alone()?;
            let policy = ds.policy_of(&path)?;
            // The policy's own protectors, a portable directory's on its medium, else this keystore's.
            let found = match ds.protectors_of(&policy).0.into_iter().find(|r| r.id == id) {
                Some(rec) => Ok(rec),
                None => ds.keystore().protector(&id),
            };
            match found {
                Ok(rec) => caller.check_protector(&rec)?,
                Err(_) if caller.may_administer() => {}
                Err(e) => return Err(e.into()),
            }
            ds.remove_protector_from(&policy, &id)?;
            Ok(())
        })
        .await
    }

    /// Changes a protector's password or PIN from `old` to `new` (no data is re-encrypted).
    async fn change_secret(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        protector: String,
        old: zvariant::OwnedFd,
        new: zvariant::OwnedFd,
    ) -> Result<()> {
        self.call("ChangeSecret", protector.clone(), &hdr, move |ctx, caller| {
            let id = parse_protector_id(&protector)?;
            let old = read_secret(old.into(), "old")?;
            let new = read_secret(new.into(), "new")?;
            let (_one, ds) = ctx.open_alone()?;
            pick::check(&ds, caller, id)?;
            ds.change_secret(
                &id,
                &mut Secrets { current: vec![(Some(id), old)], new: Some(new), ..Secrets::of(caller) },
            )?;
            Ok(())
        })
        .await
    }

    /// Whether `secret` opens the protector; changes nothing.
    #[zbus(out_args("valid"))]
    async fn verify_secret(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        protector: String,
        secret: zvariant::OwnedFd,
    ) -> Result<bool> {
        self.call("VerifySecret", protector.clone(), &hdr, move |ctx, caller| {
            let id = parse_protector_id(&protector)?;
            let secret = read_secret(secret.into(), "secret")?;
            let _one = ctx.one_at_a_time();
            let ds = ctx.open_existing()?;
            pick::check(&ds, caller, id)?;
            valid(ds.verify_protector(&id, &mut Secrets { current: vec![(Some(id), secret)], ..Secrets::of(caller) }))
        })
        .await
    }

    /// Encrypts a directory that holds data, in place, as a job: returns the job's object path
    /// at once (`org.dirseal.Dirseal1.Job`: Progress, Finished, Failed, Cancel). The directory is
    /// checked first (nothing is written when it is refused). With no `protector` option, `secret`
    /// is the password of a new protector for the directory's owner; otherwise it proves that
    /// protector. Calling it for a directory whose conversion was interrupted resumes it (`secret`
    /// then reloads the staging key after a reboot). Options: `protector` (s), `keep_backup` (b),
    /// `wipe` (b), `mode` (s: "copy", "move" — chunk by chunk, for a nearly full disk — or "auto",
    /// the default), `force` (b, root only: convert although the owner is logged in or files are
    /// open), `at_next_boot` (b: ask and prepare everything now, convert at the next boot before
    /// the login screen; the job finishes at once with state "scheduled"), `live` (b: convert
    /// while the directory is in use: the job copies and catches up in the background, its State
    /// turns "caught up" and it waits for the owner's logout; once they have no session and
    /// nothing uses the directory it commits and finishes "done"; a commit put off emits
    /// Deferred and the job catches up and waits again; Cancel aborts it in every state before
    /// the swap), `recovery_key_out` (h: a new conversion also gets a recovery key, written there,
    /// one line, before anything is encrypted; saved on the directory with the conversion, so it
    /// exists from the first copied file, whenever the conversion runs). A user's own home must
    /// not be in use by any process, theirs included, unless it is converted at the next boot or
    /// live.
    #[zbus(out_args("job"))]
    async fn convert(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        secret: zvariant::OwnedFd,
        options: Dict,
    ) -> Result<zvariant::OwnedObjectPath> {
        let bus = self.conn.clone();
        self.on_dir("Convert", dir, &hdr, move |ctx, caller, path| {
            let mut options = options;
            let recovery_out = match options.remove("recovery_key_out") {
                Some(v) => Some(fd_option(v, "recovery_key_out")?),
                None => None,
            };
            let (mut o, protector) = convert_options(&options, caller, "conversion")?;
            // A recovery key is made exactly when there is somewhere to show it.
            o.recovery_key = Some(recovery_out.is_some());
            start_job(ctx, &bus, caller, &path, secret, |ds, secret| {
                // A copy for a later step that needs the staging key again (aborting a cancelled
                // move, with whichever protector it has).
                let mut secrets =
                    Secrets { current: vec![(None, secret.duplicate())], recovery_out, ..Secrets::of(caller) };
                let plan = dirseal::convert::plan(ds, &path, o, &jobs::quiet())?;
                // A new conversion's protector; resuming makes none: the secret reloads the
                // staging key (after a reboot) with the protector named, else the staging
                // policy's own (the copy in `current`).
                let enrol = Enrol::new(ds, caller, &path, &protector, "", secret, &mut secrets)?;
                let work = jobs::Work::Convert(plan, enrol);
                Ok((work, secrets))
            })
        })
        .await
    }

    /// Cancels a conversion scheduled for the next boot (`Convert` with `at_next_boot`) that has
    /// not finished: the schedule, the held staging key, the staging directory, the new policy and
    /// the protector scheduling made are removed, and the directory is as it was. Returns the
    /// state reached ("aborted"). Refused (NotFound) when none is scheduled.
    #[zbus(out_args("state"))]
    async fn cancel_scheduled(&self, #[zbus(header)] hdr: Header<'_>, dir: String) -> Result<String> {
        self.on_dir("CancelScheduled", dir, &hdr, move |ctx, _caller, path| {
            let _one = ctx.one_at_a_time();
            let ds = ctx.open()?;
            let o = dirseal::convert::cancel_scheduled(&ds, &path, &mut Secrets::default(), &jobs::quiet())?;
            Ok(o.state.to_string())
        })
        .await
    }

    /// What converting the directory involves, as the CLI shows it before asking (`dirseal convert
    /// --json`'s `plan`): entries, data_bytes, apparent_bytes, space_needed, space_available,
    /// owner_uid, owner_name, recovery_key, keep_backup, wipe, method ("copy"/"move"), auto
    /// (whether "auto" picked it), copy_needed, move_needed, estimate (a{sv}: write_bytes_per_sec,
    /// micros_per_entry, seconds; absent when it cannot be measured). Options as for Convert. For
    /// an unfinished conversion: path and state (Convert resumes it). Writes nothing but the
    /// short, removed rate probe.
    #[zbus(out_args("plan"))]
    async fn plan_convert(&self, #[zbus(header)] hdr: Header<'_>, dir: String, options: Dict) -> Result<Dict> {
        self.on_dir("PlanConvert", dir, &hdr, move |ctx, caller, path| {
            let (mut o, _) = convert_options(&options, caller, "conversion")?;
            o.estimate = true;
            let plan = dirseal::convert::plan(&ctx.open_existing()?, &path, o, &jobs::quiet())?;
            let state = match &plan {
                dirseal::convert::Plan::Resume(p) => Some(p.state),
                dirseal::convert::Plan::New(_) => None,
            };
            plan_reply(plan.summary(), plan.source(), state)
        })
        .await
    }

    /// Turns an encrypted directory (the root of its policy) back into plaintext in place, as a
    /// job like `Convert`'s (same Progress, Finished, Failed, Cancel; calling it again resumes an
    /// interrupted one). Root, an administrator, or the directory's owner whom polkit grants
    /// `org.dirseal.Dirseal1.decrypt-own`. `secret` unlocks a locked directory (or reloads its
    /// key to resume after a reboot) with the `protector` option's protector, else the caller's
    /// own; it is not used when the key is loaded. Once done, the policy record and the
    /// protectors only it used are removed (option `keep_protectors` (b) keeps them) and the key
    /// leaves the kernel. Options: `protector` (s), `keep_backup` (b), `keep_protectors` (b),
    /// `mode` (s), `force` (b, root only).
    #[zbus(out_args("job"))]
    async fn decrypt(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        secret: zvariant::OwnedFd,
        options: Dict,
    ) -> Result<zvariant::OwnedObjectPath> {
        let (bus, target) = (self.conn.clone(), dir.clone());
        // Who may decrypt is settled with the options, before the secret is read.
        let check = move |caller: &Caller| {
            let path = caller.directory(&dir)?;
            let options = decrypt_options(&options, caller)?;
            if !caller.may_decrypt_own() {
                return Err(Error::denied(format!(
                    "decrypting needs root, or polkit action {}",
                    crate::auth::DECRYPT_ACTION
                )));
            }
            Ok((path, options))
        };
        self.checked("Decrypt", target, &hdr, check, move |ctx, caller, (path, (o, protector, keep))| {
            start_job(ctx, &bus, caller, &path, secret, |ds, secret| {
                let pick = match protector.as_str() {
                    "" => Pick::default(),
                    named => Pick { protector: Some(pick::named(ds, caller, named)?) },
                };
                let mut secrets = Secrets { current: vec![(pick.protector, secret)], ..Secrets::of(caller) };
                let plan = dirseal::decrypt::plan(ds, &path, o, pick, &mut secrets, &jobs::quiet())?;
                Ok((jobs::Work::Decrypt(plan, pick, keep), secrets))
            })
        })
        .await
    }

    /// What decrypting the directory involves, in `PlanConvert`'s shape (the CLI's `dirseal
    /// decrypt --json` `plan`); for an unfinished decrypt: path and state. Options as for
    /// Decrypt. The directory's key must be loaded (nothing is asked).
    #[zbus(out_args("plan"))]
    async fn plan_decrypt(&self, #[zbus(header)] hdr: Header<'_>, dir: String, options: Dict) -> Result<Dict> {
        self.on_dir("PlanDecrypt", dir, &hdr, move |ctx, caller, path| {
            let (mut o, _, _) = decrypt_options(&options, caller)?;
            o.estimate = true;
            let ds = ctx.open_existing()?;
            let plan = dirseal::decrypt::plan(&ds, &path, o, Pick::default(), &mut Secrets::default(), &jobs::quiet())?;
            let state = match &plan {
                dirseal::decrypt::Plan::Resume(p) => Some(p.state),
                dirseal::decrypt::Plan::New(_) => None,
            };
            plan_reply(plan.summary(), plan.source(), state)
        })
        .await
    }

    /// Creates the directory's recovery key (proved by a protector, `protector` empty: the caller's
    /// own) and writes it, one line, to `out`: shown to the user once, never stored in the clear.
    async fn recovery_add(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        protector: String,
        secret: zvariant::OwnedFd,
        out: zvariant::OwnedFd,
    ) -> Result<()> {
        self.on_dir("RecoveryAdd", dir, &hdr, move |ctx, caller, path| {
            let secret = read_secret(secret.into(), "secret")?;
            let (one, ds) = ctx.open_alone()?;
            let out: OwnedFd = out.into();
            if dirseal::recovery::read_blob(&path)?.is_some() {
                return Err(dirseal::recovery::RecoveryError::Exists { path }.into());
            }
            let policy = ds.policy_of(&path)?;
            // With escrow required, a key that could not be escrowed is never handed out.
            ds.wants_recovery_key(&path, Some(true), &mut Secrets::of(caller))?;
            let pick = choose(&ds, caller, &policy, &protector, &path)?;
            pin_try(&ds, caller, pick.protector)?;
            let (policy, master) = ds.master_key_of_dir(
                &path,
                pick,
                &mut Secrets { current: vec![(pick.protector, secret)], ..Secrets::of(caller) },
            )?;
            let key = dirseal::recovery::RecoveryKey::generate();
            let mut line = key.to_display();
            line.push('\n');
            // Shown before it is saved: a key nobody received must not become the way in. Not under
            // the lock: the caller may take its time reading.
            drop(one);
            write_secret(out, line.as_bytes(), "out")?;
            let _one = ctx.one_at_a_time();
            // Escrowed first; a record that could not be written (escrow not required) is listed
            // by `recovery escrow --check`.
            let _ = ds.save_recovery_key(&path, &policy.id, &master, &key, None)?;
            Ok(())
        })
        .await
    }

    /// Whether the recovery key read from `key` opens the directory; unlocks nothing.
    #[zbus(out_args("valid"))]
    async fn recovery_verify(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        key: zvariant::OwnedFd,
    ) -> Result<bool> {
        self.on_dir("RecoveryVerify", dir, &hdr, move |ctx, _caller, path| {
            let typed = read_secret(key.into(), "key")?;
            let _one = ctx.one_at_a_time();
            let key = dirseal::recovery::parse_key(&typed)?;
            valid(dirseal::recovery::master_key(&path, &key))
        })
        .await
    }

    /// Unlocks the directory with its recovery key and enrols a protector (existing `protector`
    /// proved by `secret`, or with `protector` empty a new password protector `name`), rebuilding
    /// the policy record if the keystore lost it. Returns the enrolled protector's id.
    #[allow(clippy::too_many_arguments)]
    #[zbus(out_args("protector"))]
    async fn recovery_restore(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        dir: String,
        key: zvariant::OwnedFd,
        protector: String,
        secret: zvariant::OwnedFd,
        name: String,
    ) -> Result<String> {
        self.on_dir("RecoveryRestore", dir, &hdr, move |ctx, caller, path| {
            let mut secrets = Secrets { recovery: Some(read_secret(key.into(), "key")?), ..Secrets::of(caller) };
            let secret = read_secret(secret.into(), "secret")?;
            let (_one, mut ds) = ctx.open_alone()?;
            let enrol = Enrol::new(&ds, caller, &path, &protector, &name, secret, &mut secrets)?;
            let (_, prec) = ds.restore_with_recovery(&path, enrol.choice(), &mut secrets)?;
            Ok(prec.id.to_string())
        })
        .await
    }

    /// Deletes the directory's recovery key (it stops working).
    async fn recovery_remove(&self, #[zbus(header)] hdr: Header<'_>, dir: String) -> Result<()> {
        self.on_dir("RecoveryRemove", dir, &hdr, move |ctx, _caller, path| {
            let (_one, ds) = ctx.open_alone()?;
            if !ds.remove_recovery_key(&path)? {
                return Err(Error::new(
                    Kind::NotFound,
                    format!("{} has no recovery key; nothing to remove", path.display()),
                ));
            }
            Ok(())
        })
        .await
    }

    /// Creates `user`'s home (from the passwd entry) encrypted from the start, with a new password
    /// protector of theirs, named after them, whose password is `secret`; the skeleton is copied
    /// in. Root or an administrator (polkit) only. The home must not exist or be empty. Options:
    /// `skel` (s: default /etc/skel; one given must pass `dirseal::home::vet_skel`: a root-owned
    /// tree below /etc/skel* or /usr/share/*/skel*). No recovery key is made
    /// (`RecoveryAdd` makes one). Returns (home, policy, protector).
    #[zbus(out_args("home", "policy", "protector"))]
    async fn create_home(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        user: String,
        secret: zvariant::OwnedFd,
        options: Dict,
    ) -> Result<(String, String, String)> {
        self.call("CreateHome", user.clone(), &hdr, move |ctx, caller| {
            use dirseal::home::{self, HomeError};
            if !caller.may_administer() {
                return Err(Error::denied(format!(
                    "only root or an administrator may create a home (polkit action {})",
                    crate::auth::MANAGE_ACTION
                )));
            }
            let mut o = home::Options { recovery_key: Some(false), ..Default::default() };
            for (k, v) in &options {
                match k.as_str() {
                    "skel" => {
                        let s = String::try_from(
                            v.try_clone().map_err(|_| Error::invalid("option skel must be of type s"))?,
                        )
                        .map_err(|_| Error::invalid("option skel must be of type s"))?;
                        o.skel = PathBuf::from(s);
                        // The caller may not read what root can: the core vets what is copied.
                        o.skel_from_caller = true;
                    }
                    other => return Err(Error::invalid(format!("unknown option {other:?}; known: skel"))),
                }
            }
            let secret = read_secret(secret.into(), "secret")?;
            let (_one, mut ds) = ctx.open_alone()?;
            let mut secrets = Secrets { new: Some(secret), ..Secrets::of(caller) };
            let made = home::Account::named(&user)
                .and_then(|acct| home::create(&mut ds, &acct, NewKind::login_default(), &o, &mut secrets));
            let made = made.map_err(|e| match e {
                HomeError::Ops(o) => Error::from(o),
                HomeError::Recovery(r) => Error::from(r),
                HomeError::Ui(u) => Error::from(ops::OpsError::Ui(u)),
                e @ HomeError::NoSuchUser(_) => Error::new(Kind::NotFound, e.to_string()),
                e @ HomeError::NotEmpty { .. } => Error::new(Kind::Busy, e.to_string()),
                e @ HomeError::Path { .. } => Error::invalid(e.to_string()),
                e @ HomeError::Skel { .. } => Error::failed(e.to_string()),
                e @ HomeError::SkelRefused { .. } => Error::invalid(e.to_string()),
            })?;
            Ok((made.home.display().to_string(), made.policy.to_string(), made.protector.to_string()))
        })
        .await
    }

    /// How many wrong PINs the device behind a protector (a tpm2 protector's TPM) still accepts
    /// before it locks out.
    #[zbus(out_args("tries"))]
    async fn get_tpm_tries_left(&self, #[zbus(header)] hdr: Header<'_>, protector: String) -> Result<u32> {
        self.call("GetTpmTriesLeft", protector.clone(), &hdr, move |ctx, caller| {
            let id = parse_protector_id(&protector)?;
            let ds = ctx.open_existing()?;
            let rec = ds.keystore().protector(&id)?;
            caller.check_protector(&rec)?;
            match rec.kind.device_tries(ds.config()) {
                Some(tries) => Ok(tries?),
                None => Err(Error::new(
                    Kind::NotSupported,
                    format!("protector {id} is a {} protector; no device counts its wrong secrets", rec.kind.name()),
                )),
            }
        })
        .await
    }
}

/// A kind's option from an a{sv} value, as the text the kind parses: a boolean, a string or an
/// unsigned number.
fn option_text(v: &OwnedValue) -> Option<String> {
    if let Ok(b) = bool::try_from(v) {
        return Some(b.to_string());
    }
    if let Ok(u) = u32::try_from(v) {
        return Some(u.to_string());
    }
    if let Ok(u) = u64::try_from(v) {
        return Some(u.to_string());
    }
    String::try_from(v.try_clone().ok()?).ok()
}

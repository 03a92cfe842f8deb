//! The client side of `dirsealed`'s D-Bus API (docs/dbus.md): typed proxies, the replies as
//! structs, secrets passed as pipes, and a service error as the sentence shown to the user.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::OwnedFd;

use zbus::zvariant::{DeserializeDict, Fd, OwnedObjectPath, Type, Value};

#[zbus::proxy(
    interface = "org.dirseal.Dirseal1",
    default_service = "org.dirseal.Dirseal1",
    default_path = "/org/dirseal/Dirseal1"
)]
pub trait Dirseal {
    fn get_status(&self, dir: &str) -> zbus::Result<Status>;
    fn plan_convert(&self, dir: &str, options: HashMap<&str, Value<'_>>) -> zbus::Result<Plan>;
    fn convert(&self, dir: &str, secret: Fd<'_>, options: HashMap<&str, Value<'_>>) -> zbus::Result<OwnedObjectPath>;
    fn cancel_scheduled(&self, dir: &str) -> zbus::Result<String>;
    fn change_secret(&self, protector: &str, old: Fd<'_>, new: Fd<'_>) -> zbus::Result<()>;
    fn recovery_verify(&self, dir: &str, key: Fd<'_>) -> zbus::Result<bool>;
}

#[zbus::proxy(interface = "org.dirseal.Dirseal1.Job", default_service = "org.dirseal.Dirseal1")]
pub trait Job {
    fn cancel(&self) -> zbus::Result<()>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn dir(&self) -> zbus::Result<String>;
}

/// Where the service keeps its job objects (docs/dbus.md, "Conversions").
const JOBS: &str = "/org/dirseal/Dirseal1/jobs";

/// The caller's running job for `dir`, if the service has one: its job objects, by introspection
/// (each answers its properties to its owner and root only, so the others are skipped), the
/// newest whose Dir is `dir` and whose State is not final.
pub async fn running_job(conn: &zbus::Connection, dir: &str) -> zbus::Result<Option<OwnedObjectPath>> {
    let intro =
        zbus::fdo::IntrospectableProxy::builder(conn).destination("org.dirseal.Dirseal1")?.path(JOBS)?.build().await?;
    let xml = match intro.introspect().await {
        Ok(x) => x,
        // No job yet: the node does not exist.
        Err(_) => return Ok(None),
    };
    let mut ids: Vec<u64> =
        xml.split("<node name=\"").skip(1).filter_map(|rest| rest.split('"').next()?.parse().ok()).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    for id in ids {
        let path = OwnedObjectPath::try_from(format!("{JOBS}/{id}"))?;
        let job = JobProxy::builder(conn)
            .path(path.clone())?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        let (Ok(d), Ok(state)) = (job.dir().await, job.state().await) else { continue };
        if d == dir && matches!(state.as_str(), "running" | "caught up" | "deferred" | "committing") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// `GetStatus`'s reply. Every field is optional so that a newer service's additions, or a key it
/// leaves out, never make the whole reply unreadable.
#[derive(Debug, Default, Clone, DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct Status {
    pub path: Option<String>,
    pub encrypted: Option<bool>,
    /// "locked", "unlocked", "partially-locked"; empty when not encrypted.
    pub key: Option<String>,
    pub protectors: Option<Vec<Protector>>,
    pub problems: Option<Vec<String>>,
    pub warnings: Option<Vec<String>>,
    pub recovery_key: Option<bool>,
    /// An unfinished (or finished) conversion's state; empty when none.
    pub conversion: Option<String>,
    pub autologin: Option<String>,
}

#[derive(Debug, Default, Clone, DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct Protector {
    pub id: Option<String>,
    pub name: Option<String>,
    pub kind: Option<String>,
    pub uid: Option<u32>,
}

/// `PlanConvert`'s reply: a new conversion's summary, or for an unfinished one its path and state.
#[derive(Debug, Default, Clone, DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct Plan {
    pub entries: Option<u64>,
    pub data_bytes: Option<u64>,
    pub space_needed: Option<u64>,
    pub space_available: Option<u64>,
    pub owner_name: Option<String>,
    pub owner_uid: Option<u64>,
    pub method: Option<String>,
    pub estimate: Option<Estimate>,
    /// Only for an unfinished conversion, which `Convert` resumes.
    pub state: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, DeserializeDict, Type)]
#[zvariant(signature = "a{sv}")]
pub struct Estimate {
    pub seconds: Option<u64>,
}

/// A secret as the service takes it: the read end of a pipe holding it. The pipe's buffer (64 KiB)
/// holds any secret the service accepts (at most 4096 bytes), so writing never blocks.
pub fn secret_pipe(secret: &str) -> std::io::Result<OwnedFd> {
    let (read, write) = rustix::pipe::pipe()?;
    std::fs::File::from(write).write_all(secret.as_bytes())?;
    Ok(read)
}

/// What the user reads when a call fails: the service's message, which says what happened and
/// what to do next (docs/dbus.md, "Errors"); for a service that cannot be reached, how to get it.
pub fn error_text(e: &zbus::Error) -> String {
    match e {
        zbus::Error::MethodError(_, Some(msg), _) if !msg.is_empty() => msg.clone(),
        zbus::Error::MethodError(name, _, _) => format!("The encryption service refused: {name}"),
        zbus::Error::FDO(e) => e.to_string(),
        other => format!(
            "The encryption service (dirsealed) could not be reached: {other}. \
             Is dirseal installed, with its D-Bus service?"
        ),
    }
}

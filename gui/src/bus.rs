//! The client side of `dirsealed`'s D-Bus API (docs/dbus.md): typed proxies, the replies as
//! structs, secrets passed as pipes, and a service error as the sentence shown to the user.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use zbus::zvariant::{DeserializeDict, Fd, OwnedObjectPath, Type, Value};
use zeroize::Zeroizing;

#[zbus::proxy(
    interface = "org.dirseal.Dirseal1",
    default_service = "org.dirseal.Dirseal1",
    default_path = "/org/dirseal/Dirseal1"
)]
pub trait Dirseal {
    fn get_status(&self, dir: &str) -> zbus::Result<Status>;
    fn plan_convert(&self, dir: &str, options: HashMap<&str, Value<'_>>) -> zbus::Result<Plan>;
    fn convert(&self, dir: &str, secret: Fd<'_>, options: HashMap<&str, Value<'_>>) -> zbus::Result<OwnedObjectPath>;
    fn recovery_add(&self, dir: &str, protector: &str, secret: Fd<'_>, out: Fd<'_>) -> zbus::Result<()>;
    fn change_secret(&self, protector: &str, old: Fd<'_>, new: Fd<'_>) -> zbus::Result<()>;
    fn recovery_verify(&self, dir: &str, key: Fd<'_>) -> zbus::Result<bool>;
}

#[zbus::proxy(interface = "org.dirseal.Dirseal1.Job", default_service = "org.dirseal.Dirseal1")]
pub trait Job {
    fn cancel(&self) -> zbus::Result<()>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
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

/// Creates the directory's recovery key, proved by the caller's own protector with `secret`, and
/// returns it as the service wrote it (one line).
pub async fn recovery_add(p: &DirsealProxy<'_>, dir: &str, secret: &str) -> zbus::Result<Zeroizing<String>> {
    let pass = secret_pipe(secret).map_err(|e| zbus::Error::InputOutput(e.into()))?;
    let (read, write) = rustix::pipe::pipe().map_err(|e| zbus::Error::InputOutput(std::io::Error::from(e).into()))?;
    p.recovery_add(dir, "", Fd::from(&pass), Fd::from(&write)).await?;
    // Our copy of the write end must close, or the read below never sees the end of the key.
    drop(write);
    let mut key = Zeroizing::new(String::new());
    std::fs::File::from(read).read_to_string(&mut key).map_err(|e| zbus::Error::InputOutput(e.into()))?;
    let trimmed = Zeroizing::new(key.trim().to_owned());
    Ok(trimmed)
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

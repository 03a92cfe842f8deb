//! `dirseal-fido2`: dirseal's security key helper, the only program that links libfido2 (and so
//! libcbor, libudev, libcrypto). dirseal, its PAM module and its service start it when a FIDO2
//! protector is used and speak to it over stdin/stdout (core/src/sys/helper.rs); one helper holds
//! at most one opened key, and ends when its input closes.
#![deny(unsafe_code)]

#[path = "fido2_ffi.rs"]
mod ffi;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use dirseal::fido2::wire::{Reply, Request, Response};
use dirseal::fido2::{Fido2Error, Pin};
use dirseal::helper::{serve, WireSecret};

const PROGRAM: &str = "dirseal-fido2";

fn main() -> ExitCode {
    if std::env::args_os().len() > 1 || std::io::stdin().is_terminal() {
        eprintln!("{PROGRAM}: dirseal's security key helper; dirseal starts it, it takes nothing on the command line");
        return ExitCode::from(2);
    }
    let mut dev: Option<ffi::Device> = None;
    serve(PROGRAM, |req: Request| -> Response { handle(&mut dev, req) })
}

fn pin(s: Option<WireSecret>) -> Result<Option<Pin>, Fido2Error> {
    s.as_ref().map(Pin::from_wire).transpose()
}

fn opened(dev: &mut Option<ffi::Device>) -> Result<&mut ffi::Device, Fido2Error> {
    dev.as_mut().ok_or(Fido2Error::Helper("the security key helper was asked before a key was opened".into()))
}

fn handle(dev: &mut Option<ffi::Device>, req: Request) -> Response {
    match req {
        Request::ListHid => Ok(Reply::Hid(ffi::list_hid()?)),
        Request::Open { path, timeout_ms } => {
            *dev = None;
            *dev = Some(ffi::Device::open(&path, Duration::from_millis(timeout_ms))?);
            Ok(Reply::Done)
        }
        Request::SetTimeout { timeout_ms } => {
            opened(dev)?.set_timeout(Duration::from_millis(timeout_ms))?;
            Ok(Reply::Done)
        }
        Request::Info => Ok(Reply::Info(opened(dev)?.info()?)),
        Request::PinRetries => Ok(Reply::Retries(opened(dev)?.pin_retries()?)),
        Request::SetPin { new, old } => {
            let new = Pin::from_wire(&new)?;
            let old = pin(old)?;
            opened(dev)?.set_pin(&new, old.as_ref())?;
            Ok(Reply::Done)
        }
        Request::MakeCredential(m) => Ok(Reply::Credential(m.answer(|req| opened(dev)?.make_credential(req))?)),
        Request::Assert(a) => Ok(Reply::Assertion(a.answer(|req| opened(dev)?.assert(req))?.into())),
    }
}

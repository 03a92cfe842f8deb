//! `dirseal-settings`, "Encryption": the desktop front end of `dirsealed` (docs/gui.md). It shows
//! the state of the user's home and encrypts it with one button, through the service's D-Bus API
//! alone (docs/dbus.md); polkit prompts, when any, come from the desktop's own agent.

mod bus;
mod text;
mod ui;

use adw::prelude::*;

/// The application id: the .desktop file, the metainfo and the icon are named after it.
const APP_ID: &str = "org.dirseal.Settings";

fn main() -> gtk::glib::ExitCode {
    let app = adw::Application::builder().application_id(APP_ID).build();
    app.connect_activate(ui::build);
    app.run()
}

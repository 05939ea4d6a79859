//! The few styles kopt's output uses. Written through `anstream`, so `NO_COLOR`,
//! `--color` and non-terminals are honoured.

use anstyle::{AnsiColor, Style};

pub fn green() -> Style {
    Style::new().fg_color(Some(AnsiColor::Green.into()))
}

pub fn yellow() -> Style {
    Style::new().fg_color(Some(AnsiColor::Yellow.into()))
}

pub fn red() -> Style {
    Style::new().fg_color(Some(AnsiColor::Red.into())).bold()
}

pub fn dim() -> Style {
    Style::new().dimmed()
}

pub fn bold() -> Style {
    Style::new().bold()
}

pub fn cyan() -> Style {
    Style::new().fg_color(Some(AnsiColor::Cyan.into()))
}

//! The terminal around a run with progress bars.

/// While alive, Ctrl-C is not echoed as `^C` on the terminal (its `ECHOCTL` flag is off).
///
/// The bars keep the cursor at the right edge of their last line; an echoed `^C` wraps to a new
/// line the bars do not know of, and their next redraw leaves a copy of the run's line behind.
/// The run answers Ctrl-C with a line of its own instead. The flag is restored on drop.
pub struct NoEchoedCtrlC {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl NoEchoedCtrlC {
    /// On stderr's terminal (nothing happens when stderr is not one).
    pub fn new() -> Self {
        #[cfg(unix)]
        {
            // SAFETY: tcgetattr/tcsetattr on fd 2 with a termios owned here; failures leave
            // the terminal as it was (`saved` stays `None`).
            unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(2, &mut t) != 0 || t.c_lflag & libc::ECHOCTL == 0 {
                    return NoEchoedCtrlC { saved: None };
                }
                let saved = t;
                t.c_lflag &= !libc::ECHOCTL;
                let ok = libc::tcsetattr(2, libc::TCSANOW, &t) == 0;
                NoEchoedCtrlC { saved: ok.then_some(saved) }
            }
        }
        #[cfg(not(unix))]
        NoEchoedCtrlC {}
    }
}

impl Drop for NoEchoedCtrlC {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(saved) = self.saved {
            // SAFETY: restores the attributes read in `new` on the same descriptor.
            unsafe { libc::tcsetattr(2, libc::TCSANOW, &saved) };
        }
    }
}

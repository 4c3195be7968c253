//! What the launcher tells its session's keeper, one line each on the keeper's stdin (a pipe
//! only the launcher holds): `podman PID` once podman runs, `ok` once the launcher has seen
//! podman exit. EOF without `ok` means the launcher died (see `launch::keeper`). The lines are
//! the ones every version wrote, so a keeper and a launcher of neighbouring versions agree.

/// One message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// podman runs with this pid.
    Podman(u32),
    /// The launcher saw podman exit: the session ended normally.
    Finished,
}

impl Message {
    /// The line (with its newline).
    pub fn line(self) -> String {
        match self {
            Message::Podman(pid) => format!("podman {pid}\n"),
            Message::Finished => "ok\n".to_string(),
        }
    }

    /// A line read from the launcher; `None` for one this version does not know.
    pub fn read(line: &str) -> Option<Message> {
        match line.trim().split_once(' ') {
            Some(("podman", pid)) => pid.trim().parse().ok().map(Message::Podman),
            None if line.trim() == "ok" => Some(Message::Finished),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn each_message_reads_back_and_nothing_else_is_one() {
        for m in [Message::Podman(4242), Message::Finished] {
            assert_eq!(Message::read(&m.line()), Some(m));
        }
        assert_eq!(Message::line(Message::Podman(7)), "podman 7\n");
        for junk in ["", "okay", "podman", "podman x", "ok ok"] {
            assert_eq!(Message::read(junk), None, "{junk:?}");
        }
    }
}

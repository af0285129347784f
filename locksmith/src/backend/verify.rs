//! The report `locksmith verify` prints, whichever backend probed (issue 12): a header, one
//! line per property, a verdict. Each backend's probe lives beside it (`lockdir/probe.rs`,
//! `ftp/probe.rs`, `postgres/probe.rs`, `etcd/probe.rs`) and fills one of these.

use std::time::Duration;

/// One property's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Relied on, and it holds.
    Ok,
    /// Relied on, and it does not hold: the backend is not safe here.
    Fail,
    /// Relied on, but not measured: taken on trust.
    Unmeasured,
    /// Measured (or stated), but this backend does not rely on it.
    Info,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Unmeasured => "unmeasured",
            Status::Info => "info",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub property: &'static str,
    pub status: Status,
    pub detail: String,
}

/// What `verify` found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub header: String,
    /// The lock as the error line names it (a path, an `ftp://` URL, a lock name, a prefix).
    pub lock: String,
    pub findings: Vec<Finding>,
    /// Why the backend is not safe here; empty: it is.
    pub problems: Vec<String>,
    /// The last line's text after `verdict: ok — ` (when safe).
    pub accepts: String,
    /// Probe names that could not be removed (the filesystem or server did not answer).
    pub left: Vec<String>,
}

impl Report {
    pub fn new(header: String, lock: String) -> Report {
        Report {
            header,
            lock,
            ..Report::default()
        }
    }

    /// Adds a line; a `Fail` is also a problem (`property: detail`).
    pub fn add(&mut self, property: &'static str, status: Status, detail: impl Into<String>) {
        let detail = detail.into();
        if status == Status::Fail {
            self.problems.push(format!("{property}: {detail}"));
        }
        self.findings.push(Finding {
            property,
            status,
            detail,
        });
    }

    /// The status of `property`'s line, if there is one.
    pub fn status(&self, property: &str) -> Option<Status> {
        self.findings
            .iter()
            .find(|f| f.property == property)
            .map(|f| f.status)
    }

    /// The report as printed: a header, one line per property, the verdict.
    pub fn render(&self) -> String {
        let mut s = format!("{}\n", self.header);
        for f in &self.findings {
            s.push_str(&format!(
                "  {:<24} {:<10} {}\n",
                f.property,
                f.status.word(),
                f.detail
            ));
        }
        if !self.left.is_empty() {
            s.push_str(&format!(
                "  (could not remove probe names: {})\n",
                self.left.join(", ")
            ));
        }
        if self.problems.is_empty() {
            s.push_str(&format!("verdict: ok — {}\n", self.accepts));
        } else {
            s.push_str(&format!("verdict: FAIL — {}\n", self.problems.join("; ")));
        }
        s
    }

    pub fn safe(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A delay for the report: `4ms`, `1.02s`.
pub fn figure(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

/// The median of some timings (zero for none).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_renders_its_lines_aligned_and_a_fail_makes_it_unsafe() {
        let mut r = Report::new("locksmith verify x: backend ftp".into(), "x".into());
        r.add("login", Status::Ok, "user u");
        r.accepts = "fine".into();
        assert!(r.safe());
        assert_eq!(
            r.render(),
            "locksmith verify x: backend ftp\n  login                    ok         user u\nverdict: ok — fine\n"
        );
        r.add("mkd exclusive", Status::Fail, "two winners");
        assert!(!r.safe());
        assert_eq!(r.problems, ["mkd exclusive: two winners"]);
        assert!(
            r.render()
                .ends_with("verdict: FAIL — mkd exclusive: two winners\n")
        );
        assert_eq!(r.status("login"), Some(Status::Ok));
    }

    #[test]
    fn figures_and_medians() {
        assert_eq!(figure(Duration::from_millis(4)), "4ms");
        assert_eq!(figure(Duration::from_millis(1020)), "1.02s");
        let ms = Duration::from_millis;
        assert_eq!(median(vec![ms(5), ms(1), ms(3)]), ms(3));
        assert_eq!(median(Vec::new()), Duration::ZERO);
    }
}

//! `locksmith verify` (issue 12): the report it prints, whichever backend probed (a header,
//! one line per property, a verdict), and the one runner of the properties each backend
//! declares.
//!
//! A backend writes only its probes (`lockdir/probe.rs`, `ftp/probe.rs`, `postgres/probe.rs`,
//! `etcd/probe.rs`): it opens a probing session (whatever must work before anything can be
//! probed: an error there ends `verify` at once) and implements [`Probing`] on it, declaring
//! each [`Property`] it relies on — or measures for information — with its probe. [`run`]
//! does the rest, the same for every backend: it runs the probes (in turn, or at once with
//! [`at_once`]), removes the probe names whatever happened (what would not go is listed),
//! turns each answer into a line and the failures of what is relied on into problems, says
//! the lines that come after the clean-up, and asks the backend what it accepts.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::settings::fmt_duration;

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
    /// The durations that probes of relied-on properties measured ([`Found::Timed`]), for the
    /// verdict to count with.
    pub measured: Vec<Duration>,
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

    /// Says what the probe of `line` found: its status by how the backend relies on it, a
    /// failure of what is relied on also a problem (as `line.problem` says).
    fn say(&mut self, line: Line, found: Found) {
        let (status, detail) = match found {
            Found::Skipped => return,
            Found::Timed(took, found) => {
                if line.reliance == Reliance::Relied {
                    self.measured.push(took);
                }
                return self.say(line, *found);
            }
            Found::Holds(d) => (Status::Ok, d),
            Found::Breaks(d) | Found::Halts(d) => (Status::Fail, d),
            Found::Unmeasured(d) => (Status::Unmeasured, d),
        };
        let (status, detail) = match (status, line.reliance) {
            (Status::Unmeasured, _) | (_, Reliance::Relied) => (status, detail),
            (_, Reliance::Aside(why)) => (Status::Info, format!("{detail} (not relied on: {why})")),
            (_, Reliance::Stated) => (Status::Info, detail),
        };
        if status == Status::Fail {
            match line.problem {
                Problem::Named => self.problems.push(format!("{}: {detail}", line.name)),
                Problem::Bare => self.problems.push(detail.clone()),
                Problem::First => self.problems.insert(0, detail.clone()),
                Problem::Elsewhere => {}
            }
        }
        self.findings.push(Finding {
            property: line.name,
            status,
            detail,
        });
    }
}

/// How a property's line counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reliance {
    /// The backend relies on it here: `ok`, or `FAIL` and a problem.
    Relied,
    /// Measured for information: the backend does not need it here, and says why after the
    /// detail (`info`).
    Aside(&'static str),
    /// Stated for information: nothing to judge (`info`).
    Stated,
}

/// How a relied-on property that fails is said among the problems (the error line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// `property: detail`, in the order of the lines.
    Named,
    /// The detail alone (it names what failed).
    Bare,
    /// The detail alone, before every other problem (locksmith's own rule for the profile).
    First,
    /// Not a problem of its own: another line's problem says it.
    Elsewhere,
}

/// What a probe found about its property.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Holds(String),
    Breaks(String),
    /// Breaks, and the probes after it (in the same run) cannot be made: they get no line.
    Halts(String),
    /// Relied on, but not measured: taken on trust.
    Unmeasured(String),
    /// A duration measured (counted by the verdict when relied on: [`Report::measured`]),
    /// and what it shows.
    Timed(Duration, Box<Found>),
    /// Not probed this time (what it needs did not hold): no line.
    Skipped,
}

/// A property's line, as a backend declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    pub name: &'static str,
    pub reliance: Reliance,
    pub problem: Problem,
}

/// A probe: run on the backend's probing session; an error ends `verify` (after the
/// clean-up).
pub type Probe<C> = Box<dyn FnOnce(&mut C) -> Result<Found> + Send>;

/// How a property is found out.
enum How<C> {
    Known(Found),
    Probed(Probe<C>),
}

impl<C> How<C> {
    fn run(self, c: &mut C) -> Result<Found> {
        match self {
            How::Known(found) => Ok(found),
            How::Probed(probe) => probe(c),
        }
    }
}

/// One property a backend declares: its line and how it is found out.
pub struct Property<C> {
    pub line: Line,
    how: How<C>,
}

impl<C> Property<C> {
    /// A property probed by `probe`, relied on or not (then `why`) for this lock.
    pub fn new(
        name: &'static str,
        relied: bool,
        why: &'static str,
        probe: impl FnOnce(&mut C) -> Result<Found> + Send + 'static,
    ) -> Self {
        let reliance = if relied {
            Reliance::Relied
        } else {
            Reliance::Aside(why)
        };
        Property::with(name, reliance, How::Probed(Box::new(probe)))
    }

    /// A property relied on, probed by `probe`.
    pub fn relied(
        name: &'static str,
        probe: impl FnOnce(&mut C) -> Result<Found> + Send + 'static,
    ) -> Self {
        Property::new(name, true, "", probe)
    }

    /// A property probed for information: nothing to judge.
    pub fn informs(
        name: &'static str,
        probe: impl FnOnce(&mut C) -> Result<Found> + Send + 'static,
    ) -> Self {
        Property::with(name, Reliance::Stated, How::Probed(Box::new(probe)))
    }

    /// A property whose answer is known before the probes run (what opening the session
    /// found, or what cannot be measured here).
    pub fn known(name: &'static str, reliance: Reliance, found: Found) -> Self {
        Property::with(name, reliance, How::Known(found))
    }

    /// A statement for information.
    pub fn stated(name: &'static str, text: impl Into<String>) -> Self {
        Property::known(name, Reliance::Stated, Found::Holds(text.into()))
    }

    /// Its failure said among the problems as `problem` says (else `property: detail`).
    pub fn said_as(mut self, problem: Problem) -> Self {
        self.line.problem = problem;
        self
    }

    fn with(name: &'static str, reliance: Reliance, how: How<C>) -> Self {
        Property {
            line: Line {
                name,
                reliance,
                problem: Problem::Named,
            },
            how,
        }
    }
}

/// Each probe's line and what it answered, in the report's order.
pub type Answers = Vec<(Line, Result<Found>)>;

/// What a backend declares and does for `verify`: implemented by its probing session (its
/// connections, the lock's directory, the names its probes made).
pub trait Probing: Sized {
    /// The report's first line, and the lock as the error line names it.
    fn header(&self) -> (String, String);

    /// The properties probed, in the report's order, each relied on or not for this lock.
    fn properties(&self) -> Vec<Property<Self>>;

    /// The lines said after the clean-up, when every probe could run (what needs the probe
    /// names gone; statements).
    fn afterwards(&self) -> Vec<Property<Self>> {
        Vec::new()
    }

    /// Runs the probes: in turn by default ([`in_turn`]); a backend whose probes may hang
    /// runs them with [`at_once`].
    fn probe(&mut self, properties: Vec<Property<Self>>) -> Answers {
        in_turn(self, properties)
    }

    /// Removes every name the probes made, whatever happened; the names that would not go.
    fn clean_up(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// The last line's text after `verdict: ok — ` (when safe); it may add problems (what
    /// to set).
    fn accepts(&mut self, report: &mut Report) -> String;
}

/// `verify` of a backend's probing session `c`: its properties probed, the probe names
/// removed, the lines and the verdict. `Err`: a probe could not go on (the connection, a
/// request refused), after the clean-up.
pub fn run<C: Probing>(mut c: C) -> Result<Report> {
    let (header, lock) = c.header();
    let mut report = Report::new(header, lock);
    let properties = c.properties();
    let answers = c.probe(properties);
    report.left = c.clean_up();
    for (line, found) in answers {
        report.say(line, found?);
    }
    for property in c.afterwards() {
        let found = property.how.run(&mut c)?;
        report.say(property.line, found);
    }
    report.accepts = c.accepts(&mut report);
    Ok(report)
}

/// The probes one after the other, until one fails to answer (an error) or halts the rest.
pub fn in_turn<C>(c: &mut C, properties: Vec<Property<C>>) -> Answers {
    let mut answers = Vec::new();
    for property in properties {
        let found = property.how.run(c);
        let halts = matches!(found, Err(_) | Ok(Found::Halts(_)));
        answers.push((property.line, found));
        if halts {
            break;
        }
    }
    answers
}

/// Every probe at once, each on a thread of its own with a copy of `c`, waited for `within`
/// in all: one that has not answered by then fails (`no answer within …`, `hangs` saying
/// what that suggests), so that a filesystem that hangs makes lines `FAIL`, not `verify`
/// hang.
pub fn at_once<C: Clone + Send + 'static>(
    c: &C,
    properties: Vec<Property<C>>,
    within: Duration,
    hangs: &str,
) -> Answers {
    let (tx, rx) = mpsc::channel();
    let mut lines = Vec::new();
    for (i, property) in properties.into_iter().enumerate() {
        lines.push(property.line);
        let (tx, mut c) = (tx.clone(), c.clone());
        std::thread::spawn(move || {
            let _ = tx.send((i, property.how.run(&mut c)));
        });
    }
    drop(tx);
    let deadline = Instant::now() + within;
    let mut answers: Vec<Option<Result<Found>>> = lines.iter().map(|_| None).collect();
    while answers.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, found)) => answers[i] = Some(found),
            Err(_) => break,
        }
    }
    let silent = || {
        Ok(Found::Breaks(format!(
            "no answer within {} ({hangs})",
            fmt_duration(within)
        )))
    };
    lines
        .into_iter()
        .zip(answers)
        .map(|(line, found)| (line, found.unwrap_or_else(silent)))
        .collect()
}

/// `yes` or `no`, as `b` says: a word of a finding's detail.
pub fn either(b: bool, yes: &'static str, no: &'static str) -> &'static str {
    if b { yes } else { no }
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

    /// A toy backend: what the runner makes of each kind of answer.
    struct Toy {
        log: Vec<&'static str>,
    }

    impl Probing for Toy {
        fn header(&self) -> (String, String) {
            ("locksmith verify t: backend toy".into(), "t".into())
        }

        fn properties(&self) -> Vec<Property<Toy>> {
            vec![
                Property::known("opened", Reliance::Relied, Found::Holds("yes".into())),
                Property::stated("stated", "a fact"),
                Property::new("aside", false, "not needed", |t: &mut Toy| {
                    t.log.push("aside");
                    Ok(Found::Breaks("slow".into()))
                }),
                Property::relied("timed", |_: &mut Toy| {
                    let ms = Duration::from_millis(7);
                    Ok(Found::Timed(ms, Box::new(Found::Holds("7ms".into()))))
                }),
                Property::relied("skipped", |_: &mut Toy| Ok(Found::Skipped)),
                Property::relied("halts", |_: &mut Toy| Ok(Found::Halts("gone".into()))),
                Property::relied("never", |t: &mut Toy| {
                    t.log.push("never");
                    Ok(Found::Holds("ran".into()))
                }),
            ]
        }

        fn clean_up(&mut self) -> Vec<String> {
            self.log.push("clean_up");
            vec!["t.probe".into()]
        }

        fn afterwards(&self) -> Vec<Property<Toy>> {
            vec![
                Property::known("rule", Reliance::Relied, Found::Breaks("unsafe".into()))
                    .said_as(Problem::First),
            ]
        }

        fn accepts(&mut self, r: &mut Report) -> String {
            r.problems.push("set x".into());
            "fine".into()
        }
    }

    #[test]
    fn the_runner_turns_answers_into_lines_problems_and_a_clean_up() {
        let r = run(Toy { log: Vec::new() }).unwrap();
        let lines: Vec<(&str, Status, &str)> = r
            .findings
            .iter()
            .map(|f| (f.property, f.status, f.detail.as_str()))
            .collect();
        assert_eq!(
            lines,
            [
                ("opened", Status::Ok, "yes"),
                ("stated", Status::Info, "a fact"),
                ("aside", Status::Info, "slow (not relied on: not needed)"),
                ("timed", Status::Ok, "7ms"),
                ("halts", Status::Fail, "gone"),
                ("rule", Status::Fail, "unsafe"),
            ]
        );
        assert_eq!(r.problems, ["unsafe", "halts: gone", "set x"]);
        assert_eq!(r.measured, [Duration::from_millis(7)]);
        assert_eq!(r.left, ["t.probe"]);
        assert_eq!(r.accepts, "fine");
    }

    #[test]
    fn at_once_fails_a_probe_that_does_not_answer_in_time() {
        let properties = vec![
            Property::relied("quick", |_: &mut ()| Ok(Found::Holds("ok".into()))),
            Property::relied("hangs", |_: &mut ()| {
                std::thread::sleep(Duration::from_secs(5));
                Ok(Found::Holds("late".into()))
            }),
        ];
        let answers = at_once(&(), properties, Duration::from_millis(200), "stuck?");
        let found: Vec<(&str, Found)> = answers
            .into_iter()
            .map(|(line, found)| (line.name, found.unwrap()))
            .collect();
        assert_eq!(
            found,
            [
                ("quick", Found::Holds("ok".into())),
                (
                    "hangs",
                    Found::Breaks("no answer within 200ms (stuck?)".into())
                ),
            ]
        );
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

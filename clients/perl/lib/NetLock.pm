package NetLock;

# A thin client of locksmith's pipe protocol (SPEC section 4), with the promises of the
# Rust crate `netlock`. Core Perl only. Documentation: the POD at the end (perldoc NetLock).

use 5.010;
use strict;
use warnings;

use Cwd ();
use Errno ();
use Fcntl qw(F_DUPFD F_GETFD F_SETFD FD_CLOEXEC F_GETFL F_SETFL O_NONBLOCK S_ISDIR);
use File::Spec ();
use IO::Poll ();
use POSIX ();
use Scalar::Util ();
use Time::HiRes ();

our $VERSION = '0.1.0';

use constant {
    HELPER_ENV  => 'LOCKSMITH_BIN',
    HELPER_NAME => 'locksmith',
    # Longest line accepted from the helper, newline included.
    MAX_LINE => 64 * 1024,
    # How long a helper that failed, or broke the protocol, gets to exit after we close
    # its pipes before it is killed (a real helper that printed ERROR exits at once).
    ABANDON_GRACE => 5,
    # Waits at least this long (seconds) are passed as `forever`.
    EFFECTIVELY_FOREVER => 100 * 365 * 24 * 3600,
    U64_MAX             => '18446744073709551615',
    # The most slots a semaphore may have (SPEC 3b).
    MAX_SLOTS => 1024,
};

my %OPTION = map { $_ => 1 } qw(profiles wait shared slots fair helper);

# The locks alive in this process (weak references), so that a child made by fork() can
# close its copies of their pipes (see after_fork).
my %LIVE;
my $WS     = qr/[ \t\n\r\f\x0b]/;

# ---------------------------------------------------------------------------------------
# Taking a lock

sub new {
    my ($class, $tag, @rest) = @_;
    after_fork();
    my $opts = _options(@rest);
    return $class->_acquire($tag, $opts, _wait_arg($opts->{wait}));
}

sub try_new {
    my ($class, $tag, @rest) = @_;
    after_fork();
    my $opts = _options(@rest);
    my $wait = exists $opts->{wait} ? _wait_arg($opts->{wait}) : '0';
    my $lock;
    my $ok = eval { $lock = $class->_acquire($tag, $opts, $wait); 1 };
    return $lock if $ok;
    my $err = $@;
    return undef if Scalar::Util::blessed($err) && $err->isa('NetLock::Error::Busy');
    die $err;
}

sub _options {
    my %opts;
    if (@_ == 1 && ref $_[0] eq 'HASH') {
        %opts = %{ $_[0] };
    } elsif (@_ % 2 == 0) {
        %opts = @_;
    } else {
        NetLock::Error::Usage->throw(
            message => 'options must be a hash reference or key => value pairs');
    }
    for my $key (sort keys %opts) {
        NetLock::Error::Usage->throw(message =>
              "unknown option `$key` (known: fair, helper, profiles, shared, slots, wait)")
          unless $OPTION{$key};
    }
    return \%opts;
}

# The --wait value: undef passes nothing (the profile decides). A number is seconds: 0 is
# `0` (try once), anything else whole milliseconds rounded up (a non-zero wait never
# becomes "try once"), infinity and a century or more `forever`. Any other string
# (`forever`, `1m30s`) goes to the helper as written.
sub _wait_arg {
    my ($wait) = @_;
    return undef unless defined $wait;
    my $bad = sub {
        NetLock::Error::Usage->throw(message =>
              "wait => '$wait': expected seconds, 'forever' or a duration such as '1m30s'"
              . ($_[0] // ''));
    };
    $bad->() if ref $wait;
    if (Scalar::Util::looks_like_number($wait)) {
        $bad->(' (not a number)') if $wait != $wait;
        $bad->(' (negative)') if $wait < 0;
        return 'forever' if $wait >= EFFECTIVELY_FOREVER;
        return '0'       if $wait == 0;
        my $micros = sprintf '%.0f', $wait * 1_000_000;
        my $millis = int(($micros + 999) / 1000);
        $millis = 1 if $millis < 1;
        return "${millis}ms";
    }
    (my $text = $wait) =~ s/^$WS+|$WS+$//g;
    $bad->() if $text eq '' || $text =~ /$WS/ || $text =~ /^-/;
    return $text;
}

# The --slots value: undef passes nothing (the profile decides); a whole number from 1 to
# MAX_SLOTS as written (leading zeros dropped); anything else dies with a usage error,
# before anything is spawned.
sub _slots_arg {
    my ($slots) = @_;
    return undef unless defined $slots;
    NetLock::Error::Usage->throw(message => "slots => '$slots': expected a number of slots from 1 to "
          . MAX_SLOTS)
      unless !ref $slots && $slots =~ /^[0-9]{1,10}\z/ && $slots >= 1 && $slots <= MAX_SLOTS;
    return 0 + $slots;
}

# Whether to pass --fair: 1 (or '1') passes it; 0, '0', '' or undef passes nothing (the
# profile decides); anything else ('maybe', 2, a reference) dies with a usage error, before
# anything is spawned.
sub _fair_arg {
    my ($fair) = @_;
    return 0 unless defined $fair;
    NetLock::Error::Usage->throw(message => "fair => '$fair': expected 1 or 0")
      unless !ref $fair && $fair =~ /\A[01]?\z/;
    return $fair ? 1 : 0;
}

# Refuses what could never be a profile name or lock address, before anything is
# spawned: an empty tag, one starting with `-` (it would read as an option), control
# characters. The helper judges the rest (and says `ERROR usage:`).
sub _check_tag {
    my ($tag) = @_;
    NetLock::Error::Usage->throw(
        message => 'no lock tag given: expected a profile name such as "phonestuff"')
      unless defined $tag && !ref $tag && length $tag;
    NetLock::Error::Usage->throw(message => "invalid lock tag \"$tag\": it must not start with '-'")
      if $tag =~ /^-/;
    NetLock::Error::Usage->throw(message => 'invalid lock tag: control characters')
      if $tag =~ /[\x00-\x1f\x7f]/;
    return $tag;
}

# `--watch-stdin [--profiles FILE] [--wait D] [--shared] [--slots N] [--fair] hold TAG
# [TAG...]`; $tags is one tag or an array reference of them; $slots is _slots_arg's, $fair
# _fair_arg's.
sub _helper_args {
    my ($tags, $opts, $wait, $slots, $fair) = @_;
    my @args = ('--watch-stdin');
    push @args, '--profiles', "$opts->{profiles}" if defined $opts->{profiles};
    push @args, '--wait',     $wait               if defined $wait;
    push @args, '--shared' if $opts->{shared};
    push @args, '--slots', $slots if defined $slots;
    push @args, '--fair' if $fair;
    push @args, 'hold', ref $tags eq 'ARRAY' ? @$tags : $tags;
    return @args;
}

sub _acquire {
    my ($class, $tags, $opts, $wait) = @_;
    # One tag, or an array reference of several (SPEC 3b).
    my @given = ref $tags eq 'ARRAY' ? @$tags : ($tags);
    NetLock::Error::Usage->throw(
        message => 'no lock tag given: expected a profile name such as "phonestuff"')
      unless @given;
    _check_tag($_) for @given;
    my $slots = _slots_arg($opts->{slots});
    my $fair  = _fair_arg($opts->{fair});
    # Each name once, in the order first given; $places[i] is $given[i]'s place among them,
    # which is its lock's place on the OK line.
    my (@sent, %place, @places);
    for my $t (@given) {
        if (!exists $place{$t}) {
            $place{$t} = scalar @sent;
            push @sent, $t;
        }
        push @places, $place{$t};
    }
    my $tag = $given[0];
    my ($path, $origin) = _find_helper($opts->{helper});
    my $shown = "`$path` ($origin)";
    my $self = bless {
        tag       => $tag,
        tags      => \@given,
        places    => \@places,
        shown     => $shown,
        owner_pid => $$,
        released  => 0,
        buf       => '',
        eof       => 0,
        problem   => undef,
    }, ref($class) || $class;
    # Until the OK line, DESTROY must not act: _abandon cleans up instead.
    $self->{released} = 1;
    @{$self}{qw(pid to_child from_child)} = _spawn($path, $shown, _helper_args(\@sent, $opts, $wait, $slots, $fair));

    my ($line, $parsed);
    my $read_ok = eval {
        $line = $self->_read_line;
        $parsed = _parse_line($line) if defined $line;
        1;
    };
    if (!$read_ok) {
        # A protocol error, a read error, or a die from a signal handler (alarm) while
        # waiting: the helper stops waiting when its pipes close.
        my $err = $@;
        my ($code) = $self->_abandon;
        $err->{exit_code} = $code if Scalar::Util::blessed($err) && $err->isa('NetLock::Error');
        die $err;
    }
    if ($parsed && $parsed->{type} eq 'OK') {
        if ($parsed->{profile} eq $tag || $parsed->{profile} eq _shown_tag($tag)) {
            $self->{ok}       = $parsed;
            $self->{released} = 0;
            _set_nonblocking($self->{from_child});
            Scalar::Util::weaken($LIVE{ Scalar::Util::refaddr($self) } = $self);
            $self->_names_merged(scalar @sent) if @{ $parsed->{locks} } != @sent;
            return $self;
        }
        $self->_abandon;
        NetLock::Error::Protocol->throw(message =>
              "helper $shown answered for profile \"$parsed->{profile}\" instead of \"$tag\": $line");
    }
    my ($code, $killed) = $self->_abandon;
    if ($parsed && $parsed->{type} eq 'ERROR') {
        my $class = $parsed->{class} // NetLock::Error::class_for_code($code);
        NetLock::Error::Protocol->throw(
            message   => "$parsed->{word}: $parsed->{message}",
            exit_code => $code
        ) unless $class;
        my $message =
          $parsed->{class} ? $parsed->{message} : "$parsed->{word}: $parsed->{message}";
        $class->throw(message => $message, exit_code => $code);
    }
    if ($parsed) {    # LOST
        NetLock::Error::Protocol->throw(
            message   => "helper $shown said LOST before OK: $line",
            exit_code => $code
        );
    }
    # End-of-file without a status line.
    my $how =
        $killed ? 'closed its stdout without a status line and was killed after '
      . ABANDON_GRACE . ' s'
      : defined $code ? "exited with status $code without writing a status line"
      :                 'was killed by a signal without writing a status line';
    (NetLock::Error::class_for_code($code) // 'NetLock::Error::Protocol')
      ->throw(message => "helper $shown $how (see its stderr)", exit_code => $code);
}

# The OK line's profile field for $tag, as the helper writes it (SPEC 3a): each whitespace
# or control character written %XX per UTF-8 byte (a space is %20), so that it stays one
# word. In bytes, as the line is read; a tag that is not UTF-8 is compared as given.
sub _shown_tag {
    my ($tag) = @_;
    utf8::encode($tag) if utf8::is_utf8($tag);
    my $chars = $tag;
    return $tag unless utf8::decode($chars);
    $chars =~ s{([\p{White_Space}\p{Cc}])}{
        my $c = $1;
        utf8::encode($c);
        join '', map { sprintf '%%%02X', $_ } unpack 'C*', $c;
    }ge;
    utf8::encode($chars) if utf8::is_utf8($chars);
    return $chars;
}

# A set in which the helper took fewer locks than the different names given (two names for
# one lock, which it takes once): which token is whose cannot be told, so it is released and
# refused with a usage error.
sub _names_merged {
    my ($self, $names) = @_;
    my $held    = @{ $self->{ok}{locks} };
    my $message = "$names different lock names were given but the helper took $held locks "
      . "(\"$self->{ok}{raw}\"): some of the names are the same lock (a profile and its "
      . 'address?), and which token is whose cannot be told; name each lock once';
    my $err = eval { $self->unlock; 1 } ? undef : $@;
    NetLock::Error::Usage->throw(message => $err ? "$message; releasing: $err" : "$message; released");
}

# ---------------------------------------------------------------------------------------
# Finding and starting the helper

# The helper to run and how it was found: helper =>, else $LOCKSMITH_BIN, else
# `locksmith` in a trusted directory on $PATH (see _untrusted).
sub _find_helper {
    my ($explicit) = @_;
    return ("$explicit", 'given as helper =>') if defined $explicit;
    my $env = $ENV{+HELPER_ENV};
    # Set to a missing file is a spawn error, not a fall-through: the user asked for it.
    return ($env, 'from $' . HELPER_ENV) if defined $env && length $env;
    my @skipped;
    for my $dir (split /:/, $ENV{PATH} // '') {
        # An empty or relative entry means the current directory: never looked at.
        next unless length $dir && File::Spec->file_name_is_absolute($dir);
        my $candidate = File::Spec->catfile($dir, HELPER_NAME);
        next unless -f $candidate && -x _;
        if (my $why = _untrusted($candidate)) {
            push @skipped, "$candidate ($why)";
            next;
        }
        return ($candidate, 'looked up on $PATH');
    }
    NetLock::Error::Spawn->throw(message => 'no `'
          . HELPER_NAME
          . '` helper found: set $'
          . HELPER_ENV
          . ' or pass helper =>, or install it in a directory on $PATH that only you or root can write'
          . (@skipped ? '; skipped: ' . join(', ', @skipped) : ''));
}

# Why $candidate must not be run, or undef. The directory it is found in, the real file
# (symlinks resolved) and the directory holding the real file must be owned by root or by
# us and not writable by group or others; their ancestors must be owned by root or by us
# too, and may be writable by others only with the sticky bit (/tmp).
sub _untrusted {
    my ($candidate) = @_;
    my $check = sub {
        my ($path, $strict) = @_;
        my @st = stat $path or return "$path: $!";
        my ($mode, $uid) = @st[ 2, 4 ];
        return "$path is owned by uid $uid" unless $uid == 0 || $uid == $>;
        if ($mode & 022) {
            return "$path is writable by group or others"
              if $strict || !(S_ISDIR($mode) && ($mode & 01000));
        }
        return undef;
    };
    my $chain = sub {
        my ($dir) = @_;
        my $real = Cwd::realpath($dir) // return "$dir: cannot resolve";
        my $why  = $check->($real, 1);
        while (!defined $why && $real ne '/') {
            $real = _dirname($real);
            $why  = $check->($real, 0);
        }
        return $why;
    };
    my $dir  = _dirname(File::Spec->rel2abs($candidate));
    my $real = Cwd::realpath($candidate) // return "$candidate: cannot resolve";
    my $why  = $chain->($dir) // $check->($real, 1);
    return $why if defined $why;
    my $real_dir = _dirname($real);
    return $chain->($real_dir) if $real_dir ne (Cwd::realpath($dir) // '');
    return undef;
}

sub _dirname {
    my ($path) = @_;
    $path =~ s{/+[^/]*$}{};
    return length $path ? $path : '/';
}

# fork(2) + execve(2) of the helper with stdin and stdout on pipes we keep (close-on-exec
# on our side, so other programs we start do not inherit them) and stderr inherited.
# Returns (pid, the helper's stdin, the helper's stdout).
sub _spawn {
    my ($path, $shown, @args) = @_;
    my ($child_in, $to_child, $from_child, $child_out, $status_r, $status_w);
    pipe($child_in, $to_child)   or NetLock::Error::Spawn->throw(message => "pipe: $!");
    pipe($from_child, $child_out) or NetLock::Error::Spawn->throw(message => "pipe: $!");
    pipe($status_r, $status_w)   or NetLock::Error::Spawn->throw(message => "pipe: $!");
    # Perl sets close-on-exec only above $^F (2); a process that closed STDIN can get
    # lower descriptors from pipe(), so set it on every end explicitly.
    _cloexec($_) for $child_in, $to_child, $from_child, $child_out, $status_r, $status_w;

    my $pid = fork;
    if (!defined $pid) {
        my $err = "$!";
        close $_ for $child_in, $to_child, $from_child, $child_out, $status_r, $status_w;
        NetLock::Error::Spawn->throw(message => "could not start helper $shown: fork: $err");
    }
    if ($pid == 0) {
        # The child: put the pipes on 0 and 1 (moved above 2 first, so that neither can
        # overwrite the other), then exec. Anything that fails is reported on $status_w.
        # The helper starts as a program started by a shell would: no signal blocked,
        # SIGPIPE at its default.
        $SIG{__DIE__} = 'DEFAULT';
        $SIG{PIPE}    = 'DEFAULT';
        POSIX::sigprocmask(POSIX::SIG_SETMASK(), POSIX::SigSet->new);
        my $ok = eval {
            my $in  = fcntl($child_in,  F_DUPFD, 3) // die "dup: $!\n";
            my $out = fcntl($child_out, F_DUPFD, 3) // die "dup: $!\n";
            defined POSIX::dup2($in,  0) or die "dup2: $!\n";
            defined POSIX::dup2($out, 1) or die "dup2: $!\n";
            POSIX::close($in);
            POSIX::close($out);
            { no warnings 'exec'; exec { $path } $path, @args; }
            die "$!\n";
        };
        my $why = $@ || "exec failed\n";
        syswrite $status_w, $why;
        POSIX::_exit(127);
    }
    close $_ for $child_in, $child_out, $status_w;
    my $report = '';
    while (1) {
        my $n = sysread $status_r, $report, 4096, length $report;
        last if defined $n && $n == 0;
        next if defined $n || $! == Errno::EINTR();
        last;
    }
    close $status_r;
    if (length $report) {
        chomp $report;
        close $_ for $to_child, $from_child;
        _waitpid($pid);
        NetLock::Error::Spawn->throw(message => "could not start helper $shown: $report");
    }
    return ($pid, $to_child, $from_child);
}

sub _cloexec {
    my ($fh) = @_;
    my $flags = fcntl($fh, F_GETFD, 0);
    fcntl($fh, F_SETFD, $flags | FD_CLOEXEC) if defined $flags;
}

sub _set_nonblocking {
    my ($fh) = @_;
    my $flags = fcntl($fh, F_GETFL, 0);
    fcntl($fh, F_SETFL, $flags | O_NONBLOCK) if defined $flags;
}

# waitpid(2) for our helper, retried on EINTR, with SIGCHLD at its default for the
# duration so that a reaping $SIG{CHLD} handler cannot take our helper's status.
# Returns the status ($?), or undef if the helper was reaped by someone else.
sub _waitpid {
    my ($pid, $flags) = @_;
    local $SIG{CHLD} = 'DEFAULT';
    while (1) {
        my $r = waitpid $pid, $flags // 0;
        return $? if $r == $pid;
        return 'running' if $r == 0;
        next if $! == Errno::EINTR();
        return undef;
    }
}

# Exit code (undef if killed by a signal or unknown) and signal of a waitpid status.
sub _decode_status {
    my ($status) = @_;
    return (undef, undef) unless defined $status;
    return (POSIX::WEXITSTATUS($status), undef) if POSIX::WIFEXITED($status);
    return (undef, POSIX::WTERMSIG($status)) if POSIX::WIFSIGNALED($status);
    return (undef, undef);
}

# Closes both pipes, waits up to ABANDON_GRACE for the helper to exit, then kills it;
# always reaps it. Only used before a lock exists, when the helper holds nothing for us.
# Returns (exit code, killed).
sub _abandon {
    my ($self) = @_;
    close $self->{to_child}   if $self->{to_child};
    close $self->{from_child} if $self->{from_child};
    my $deadline = Time::HiRes::time() + ABANDON_GRACE;
    my $pause    = 0.001;
    while (1) {
        my $status = _waitpid($self->{pid}, POSIX::WNOHANG());
        if (!defined $status || $status ne 'running') {
            my ($code) = _decode_status($status);
            return ($code, 0);
        }
        last if Time::HiRes::time() >= $deadline;
        Time::HiRes::sleep($pause);    # reaping a wrong binary, not synchronisation
        $pause *= 2 if $pause < 0.05;
    }
    kill 'KILL', $self->{pid};
    my ($code) = _decode_status(_waitpid($self->{pid}));
    return ($code, 1);
}

# ---------------------------------------------------------------------------------------
# Reading the helper's lines

# One read(2) into the buffer. False if non-blocking and nothing is there yet.
sub _fill {
    my ($self) = @_;
    while (1) {
        my $n = sysread $self->{from_child}, $self->{buf}, 65536, length $self->{buf};
        if (defined $n) {
            $self->{eof} = 1 if $n == 0;
            return 1;
        }
        my $errno = $! + 0;
        # Blocking (before OK): retry after a signal; a handler that dies ends the loop.
        # Numeric errno, not %!: DESTROY may get here during global destruction.
        next if $errno == Errno::EINTR() && !$self->{ok};
        return 0
          if $errno == Errno::EAGAIN() || $errno == Errno::EWOULDBLOCK() || $errno == Errno::EINTR();
        my $err = "$!";
        $self->{eof} = 1;
        NetLock::Error::Io->throw(message => "reading the helper's stdout: $err");
    }
}

# The next complete line in the buffer (without its newline), or undef.
sub _take_line {
    my ($self) = @_;
    my $nl = index $self->{buf}, "\n";
    if ($nl < 0 || $nl >= MAX_LINE) {
        if (length $self->{buf} >= MAX_LINE) {
            $self->{buf} = '';
            NetLock::Error::Protocol->throw(
                message => 'helper wrote a line longer than ' . MAX_LINE . ' bytes');
        }
        if ($self->{eof} && length $self->{buf}) {
            my $partial = $self->{buf};
            $self->{buf} = '';
            NetLock::Error::Protocol->throw(
                message => "helper's stdout ended in the middle of a line: \"$partial\"");
        }
        return undef;
    }
    my $line = substr $self->{buf}, 0, $nl;
    substr($self->{buf}, 0, $nl + 1) = '';
    my $decoded = $line;
    utf8::decode($decoded)
      or NetLock::Error::Protocol->throw(message => "helper wrote a line that is not UTF-8: \"$line\"");
    return $decoded;
}

# Blocks until a whole line or end-of-file (undef).
sub _read_line {
    my ($self) = @_;
    while (1) {
        my $line = $self->_take_line;
        return $line if defined $line;
        return undef if $self->{eof};
        $self->_fill;
    }
}

# Parses one line (without its newline) into a hash: type OK (profile, fields, token),
# ERROR (word, message, class: undef for a word the helper may not send), LOST (reason).
sub _parse_line {
    my ($line) = @_;
    my $bad = sub {
        NetLock::Error::Protocol->throw(message => "unexpected line from helper ($_[0]): \"$line\"");
    };
    my ($first, $rest) = split /$WS+/, $line, 2;
    $first //= '';
    $rest  //= '';
    $rest =~ s/^$WS+|$WS+$//g;
    if ($first eq 'OK') {
        my @words = grep { length } split /$WS+/, $rest;
        # The first word is always the profile field (SPEC 4), whatever it holds: for a
        # lock address it is the address as given (SPEC 3a), `?k=v&...` included.
        $bad->('OK without a profile name') if !@words;
        my $profile = shift @words;
        my (@fields, %map);
        for my $word (@words) {
            $bad->("`$word` is not key=value") unless $word =~ /=/;
            my ($key, $value) = split /=/, $word, 2;
            $bad->("`$word` has an empty key") unless length $key;
            $bad->("`$key=` appears twice") if exists $map{$key};
            $map{$key} = $value;
            push @fields, [ $key, $value ];
        }
        # One lock unless locks=N says more (SPEC 3b); then each of backend=, mode= and
        # token= has N comma-separated values.
        my $n;
        if (defined $map{locks}) {
            $bad->("locks=$map{locks} is not a positive integer")
              unless $map{locks} =~ /^[0-9]+\z/ && $map{locks} =~ /[1-9]/;
            $n = $map{locks} + 0;
        }
        my $each = sub {
            my ($key) = @_;
            my $value = $map{$key};
            return ($value) unless defined $n;
            my @parts = split /,/, $value, -1;
            $bad->("$key=$value has " . @parts . " values for locks=$n") unless @parts == $n;
            return @parts;
        };
        $bad->('OK without backend=') unless defined $map{backend} && length $map{backend};
        my @backends = $each->('backend');
        $bad->('backend= with an empty value') if grep { !length } @backends;
        my @modes = defined $map{mode} ? $each->('mode') : ('exclusive') x @backends;
        for my $mode (@modes) {
            $bad->("mode=$mode is neither exclusive nor shared")
              unless $mode =~ /^(?:exclusive|shared)\z/;
        }
        my @tokens = (undef) x @backends;
        if (defined $map{token}) {
            my $t     = $map{token};
            my @parts = $each->('token');
            for my $i (0 .. $#parts) {
                my $part = $parts[$i];
                # Several locks: a lock without a token leaves its place empty.
                next if $part eq '' && defined $n;
                (my $digits = $part) =~ s/^0+(?=[0-9])//;
                $bad->("token=$t is not an unsigned 64-bit integer")
                  unless $part =~ /^[0-9]+\z/
                  && (length $digits < 20 || (length $digits == 20 && $digits le U64_MAX));
                $tokens[$i] = $digits;
            }
        }
        # Semaphores (SPEC 3b): slot=K slots=N, one value per lock, both empty for a lock of
        # one slot.
        my $numbers = sub {
            my ($key) = @_;
            return (undef) x @backends unless defined $map{$key};
            return map {
                    $_ eq '' && defined $n ? undef
                  : /^[0-9]{1,10}\z/ && $_ < 2**32 ? 0 + $_
                  : $bad->("$key=$map{$key} is not a number")
            } $each->($key);
        };
        my @slot  = $numbers->('slot');
        my @count = $numbers->('slots');
        for my $i (0 .. $#backends) {
            next if !defined $slot[$i] && !defined $count[$i];
            $bad->('slot=' . ($map{slot} // '') . ' slots=' . ($map{slots} // '')
                  . ': a slot needs its number of slots, and below it')
              unless defined $slot[$i] && defined $count[$i] && $slot[$i] < $count[$i];
        }
        my @locks = map {
            {
                backend => $backends[$_],
                shared  => $modes[$_] eq 'shared' ? 1 : 0,
                token   => $tokens[$_],
                slot    => $slot[$_],
                slots   => $count[$_],
            }
        } 0 .. $#backends;
        return {
            type    => 'OK',
            raw     => $line,
            profile => $profile,
            fields  => \@fields,
            map     => \%map,
            locks   => \@locks,
            # One token (or slot) for a set would be some lock's, not the set's.
            token      => @locks == 1 ? $locks[0]{token} : undef,
            slot       => @locks == 1 ? $locks[0]{slot}  : undef,
            slot_count => @locks == 1 ? $locks[0]{slots} : undef,
        };
    }
    if ($first eq 'ERROR') {
        $bad->('ERROR without `<kind>:`') unless $rest =~ /:/;
        my ($word, $message) = split /:/, $rest, 2;
        $word =~ s/^$WS+|$WS+$//g;
        $message =~ s/^$WS+|$WS+$//g;
        $bad->('ERROR with an empty kind') unless length $word;
        return {
            type    => 'ERROR',
            word    => $word,
            message => $message,
            class   => NetLock::Error::class_for_word($word)
        };
    }
    return { type => 'LOST', reason => $rest } if $first eq 'LOST';
    $bad->('expected OK, ERROR or LOST');
}

# Reads what the helper wrote since, without blocking; notes the first problem.
sub _pump {
    my ($self) = @_;
    while (!$self->{eof}) {
        my $more = eval { $self->_fill };
        if (!defined $more) { $self->_note($@); last }
        last unless $more;
    }
    while (1) {
        my $line;
        my $ok = eval { $line = $self->_take_line; 1 };
        if (!$ok) { $self->_note($@); next }
        return unless defined $line;
        $self->_note(_after_ok($line));
    }
}

sub _note {
    my ($self, $err) = @_;
    $self->{problem} //= $err;
}

# What a line after OK means: only LOST is expected; all of it means the lock is no
# longer trusted.
sub _after_ok {
    my ($line) = @_;
    my $parsed = eval { _parse_line($line) } or return $@;
    return NetLock::Error::Lost->new(message => length $parsed->{reason}
        ? $parsed->{reason}
        : 'the helper reported the lock lost')
      if $parsed->{type} eq 'LOST';
    return $parsed->{class}->new(message => $parsed->{message})
      if $parsed->{type} eq 'ERROR' && $parsed->{class};
    return NetLock::Error::Protocol->new(message => "unexpected line from helper after OK: \"$line\"");
}

# ---------------------------------------------------------------------------------------
# The guard

sub token        { $_[0]{ok}{token} }
sub slot         { $_[0]{ok}{slot} }
sub slot_count   { $_[0]{ok}{slot_count} }
sub prev_crashed { ($_[0]{ok}{map}{prev} // '') eq 'crashed' ? 1 : 0 }
sub profile      { $_[0]{ok}{profile} }
sub backend      { $_[0]{ok}{map}{backend} }
sub is_shared    { (grep { !$_->{shared} } @{ $_[0]{ok}{locks} }) ? 0 : 1 }

# One entry per name given, in that order (see the POD).
sub tags     { @{ $_[0]{tags} } }
sub tokens      { $_[0]->_per_name('token') }
sub backends    { $_[0]->_per_name('backend') }
sub slots       { $_[0]->_per_name('slot') }
sub slot_counts { $_[0]->_per_name('slots') }
sub _per_name   { my ($self, $key) = @_; map { $self->{ok}{locks}[$_]{$key} } @{ $self->{places} } }
sub field        { $_[0]{ok}{map}{ $_[1] } }
sub status_line  { $_[0]{ok}{raw} }
sub helper_pid   { $_[0]{pid} }
sub fileno       { CORE::fileno($_[0]{from_child}) }

sub is_held {
    my ($self) = @_;
    return 0 if $self->{released} || $$ != $self->{owner_pid};
    $self->_pump;
    return (defined $self->{problem} || $self->{eof}) ? 0 : 1;
}

# Lost: LOST or anything unexpected, the helper gone before unlock, or a release that
# failed. A clean unlock is not a loss.
sub lost {
    my ($self) = @_;
    return $self->{release_failed} ? 1 : 0 if $self->{released};
    return $self->is_held ? 0 : 1;
}

sub check {
    my ($self) = @_;
    return 1 if $self->is_held;
    NetLock::Error::Lost->throw(message => 'the lock was released') if $self->{released};
    die $self->{problem} if $self->{problem};
    NetLock::Error::Lost->throw(
        message => "the helper (pid $self->{pid}) exited while holding the lock");
}

sub wait_lost {
    my ($self, $timeout) = @_;
    my $deadline = defined $timeout ? Time::HiRes::time() + $timeout : undef;
    return $self->lost if $self->{released};
    while (1) {
        return 1 unless $self->is_held;
        my $left;
        if (defined $deadline) {
            $left = $deadline - Time::HiRes::time();
            return 0 if $left <= 0;
        }
        my $poll = IO::Poll->new;
        $poll->mask($self->{from_child} => IO::Poll::POLLIN());
        $poll->poll($left);
    }
}

sub unlock {
    my ($self) = @_;
    return 0 if $self->{released};
    if ($$ != $self->{owner_pid}) {
        $self->_forget;
        return 0;
    }
    my $err = $self->_release;
    if ($err) {
        $self->{release_failed} = 1;
        die $err;
    }
    return 1;
}

# In a child made by fork(): drops every lock inherited from the parent (closes this
# process's copies of their pipes). Called by new and try_new; call it yourself in a
# forked child that takes no lock but lives on. Returns how many it dropped.
sub after_fork {
    my $dropped = 0;
    for my $key (keys %LIVE) {
        my $lock = $LIVE{$key};
        if (!$lock) { delete $LIVE{$key}; next }
        next if $lock->{owner_pid} == $$;
        $lock->_forget;
        $dropped++;
    }
    return $dropped;
}

# In a child made by fork(): close our copies of the pipes, touch nothing else.
sub _forget {
    my ($self) = @_;
    delete $LIVE{ Scalar::Util::refaddr($self) };
    $self->{released} = 1;
    close $self->{to_child};
    close $self->{from_child};
}

# Closes the helper's stdin, reaps it, and judges how it ended. Runs once. Returns the
# error, or undef if the release went well.
sub _release {
    my ($self) = @_;
    delete $LIVE{ Scalar::Util::refaddr($self) };
    $self->{released} = 1;
    my $pid = $self->{pid};
    $self->_pump;
    # Did the helper end before we asked? Its stdout said so, or it can be reaped now.
    my $status      = _waitpid($pid, POSIX::WNOHANG());
    my $gone_before = $self->{eof} || !defined $status || $status ne 'running';
    close $self->{to_child};
    $status = _waitpid($pid) if defined $status && $status eq 'running';
    # It has exited: everything it wrote is in the pipe.
    $self->_pump;
    close $self->{from_child};
    my ($code, $signal) = _decode_status($status);
    if (my $err = $self->{problem}) {
        $err->{exit_code} = $code if Scalar::Util::blessed($err) && $err->isa('NetLock::Error');
        return $err;
    }
    if (!defined $status) {
        return NetLock::Error::Io->new(message =>
              "the helper (pid $pid) was reaped by someone else (a \$SIG{CHLD} handler set to "
              . "IGNORE or reaping all children?): how the release went is unknown");
    }
    my $when = $gone_before ? 'before unlock was asked for' : 'while releasing the lock';
    if (defined $code && $code == 0) {
        return undef unless $gone_before;
        return NetLock::Error::Lost->new(
            message => "the helper (pid $pid) exited with status 0 $when: the lock was released "
              . 'early (was locksmith sent SIGTERM, SIGINT or SIGHUP?)',
            exit_code => 0
        );
    }
    if (defined $code) {
        my $class = NetLock::Error::class_for_code($code) // 'NetLock::Error::Protocol';
        return $class->new(
            message => "the helper (pid $pid) exited with status $code $when, without a LOST line "
              . '(see its stderr)',
            exit_code => $code
        );
    }
    return NetLock::Error::Lost->new(message => "the helper (pid $pid) was killed by signal "
          . ($signal // '?')
          . " $when: the lock is no longer held by it and becomes breakable as its backend allows");
}

sub DESTROY {
    my ($self) = @_;
    return if $self->{released} || !$self->{ok};
    local ($@, $!, $?);
    if ($$ != $self->{owner_pid}) {
        eval { $self->_forget };
        return;
    }
    my $err = eval { $self->_release } // $@;
    warn "netlock: releasing \"$self->{ok}{profile}\": $err" if $err;
}

# ---------------------------------------------------------------------------------------
# Errors

package NetLock::Error;

use overload '""' => sub { $_[0]->as_string }, bool => sub { 1 }, fallback => 1;

my %BY_WORD = (
    busy        => 'NetLock::Error::Busy',
    config      => 'NetLock::Error::Config',
    unavailable => 'NetLock::Error::Unavailable',
    denied      => 'NetLock::Error::Denied',
    lost        => 'NetLock::Error::Lost',
    usage       => 'NetLock::Error::Usage',
    io          => 'NetLock::Error::Io',
);
my %BY_CODE = (
    64 => 'NetLock::Error::Usage',
    69 => 'NetLock::Error::Unavailable',
    74 => 'NetLock::Error::Lost',
    75 => 'NetLock::Error::Busy',
    77 => 'NetLock::Error::Denied',
    78 => 'NetLock::Error::Config',
);

sub class_for_word { $BY_WORD{ $_[0] } }
sub class_for_code { defined $_[0] ? $BY_CODE{ $_[0] } : undef }

sub new {
    my ($class, %args) = @_;
    return bless { message => $args{message} // '', exit_code => $args{exit_code} }, $class;
}

sub throw { my $class = shift; die $class->new(@_) }

sub kind      { $_[0]->KIND }
sub KIND      { 'error' }
sub message   { $_[0]{message} }
sub exit_code { $_[0]{exit_code} }
sub as_string { 'locksmith: ' . $_[0]->kind . ': ' . $_[0]->message . "\n" }

for my $spec (
    [ Busy => 'busy' ], [ Config => 'config' ], [ Unavailable => 'unavailable' ],
    [ Denied => 'denied' ], [ Lost => 'lost' ], [ Usage => 'usage' ], [ Io => 'io' ],
    [ Spawn => 'spawn' ], [ Protocol => 'protocol' ],
  )
{
    my ($name, $kind) = @$spec;
    no strict 'refs';
    @{"NetLock::Error::${name}::ISA"} = ('NetLock::Error');
    *{"NetLock::Error::${name}::KIND"} = sub { $kind };
}

1;

__END__

=head1 NAME

NetLock - crash-safe locks held by a locksmith helper process

=head1 SYNOPSIS

    use NetLock;

    my $lock = NetLock->new('phonestuff');   # blocks until the lock is ours; dies if not
    # ... upload phone.tsv, passing $lock->token to the server if it checks tokens ...
    $lock->unlock;                            # returns once the lock is really gone

    # Not waiting: undef when someone else holds it
    my $nightly = NetLock->try_new('nightly', profiles => '/etc/myapp/locks.toml')
      or exit 0;

    # Several locks at once: all held, or none (and the error of the one that failed)
    my $set = NetLock->new([ 'mkdir:/srv/locks/db', '/var/lock/cache.lock' ], wait => 30);
    my ($db_token, $cache_token) = $set->tokens;    # in the order named
    $set->unlock;                                    # releases them all

    # A semaphore: up to 2 holders at once, each in its own slot (0 or 1)
    my $gpu = NetLock->new('/var/lock/gpu', slots => 2);
    print "training on GPU ", $gpu->slot, "\n";

    # A fair queue: waiters served in the order they began to wait
    my $turn = NetLock->new('mkdir:/shared/locks/deploy', fair => 1);

    # Waiting a while, and telling errors apart
    my $deploy = eval { NetLock->new('deploy', { wait => 30 }) };
    if (!$deploy) {
        die $@ unless ref $@ && $@->isa('NetLock::Error::Busy');
        warn "still busy after 30 s: ", $@->message, "\n";
    }

=head1 DESCRIPTION

A NetLock object is a lock (a L<flock(2)> file, a lock directory on NFS or on an FTP server,
an etcd key, a PostgreSQL advisory lock, an S3 object, a Redis key) taken and held by a small helper process,
C<locksmith>, on behalf of this one. The helper releases it when the object is unlocked or
destroyed, and also B<at once if this process dies>, however it dies (even C<kill -9>).
This module only names a I<profile>; which backend, which server and which credentials it
means is written in the profiles file the helper reads, so no password travels on a
command line.

How it works: C<new> runs
C<locksmith --watch-stdin [--profiles FILE] [--wait D] [--shared] [--slots N] [--fair] hold TAG [TAG...]> with its stdin
and stdout on pipes this object keeps, and its stderr inherited (the helper's waiting
message and logs appear on your stderr). It reads one line: C<OK E<lt>profileE<gt>
backend=... [token=N] [prev=crashed] [slot=K slots=N] ...>, or C<ERROR E<lt>kindE<gt>: E<lt>messageE<gt>>
and an exit code (64 usage, 69 unavailable, 74 lost/io, 75 busy, 77 denied, 78 config).
While held, the helper writes nothing more, except C<LOST E<lt>reasonE<gt>> if the lock is
lost (then it exits 74). Releasing closes the helper's stdin and waits for it to exit.

Core Perl only (POSIX, Fcntl, IO::Poll, Time::HiRes). Linux and other POSIX systems.

=head1 CONSTRUCTORS

=head2 new

    my $lock = NetLock->new($tag);
    my $lock = NetLock->new($tag, %options);
    my $lock = NetLock->new($tag, \%options);

Takes the lock named by C<$tag> (a profile name) and returns the object. Blocks until the
helper answers: as long as the profile's C<wait> says unless C<wait> is given (built-in
default: forever). Dies with a L</ERRORS> object on failure: C<NetLock::Error::Busy> when
the wait ran out, C<::Config>, C<::Unavailable>, C<::Denied>, C<::Usage>, C<::Spawn>, ...

C<$tag> may also be an array reference of several names (profiles or lock addresses, any
mix of backends): see L</SEVERAL LOCKS>.

Options:

=over 4

=item profiles => FILE

The profiles file (C<--profiles>). Default: the helper's own lookup
(C<$LOCKSMITH_PROFILES>, C<~/.config/locksmith/profiles.toml>,
C</etc/locksmith/profiles.toml>). The helper refuses a file holding a password that group
or others can read.

=item wait => SECONDS | DURATION

Give up after this long: a number of seconds (C<0> tries once; fractions are rounded up to
whole milliseconds), or a duration string the helper understands (C<'forever'>,
C<'250ms'>, C<'1m30s'>). Default: the profile's C<wait>.

=item shared => BOOL

Take a shared (reader) lock (C<--shared>). The helper refuses with a usage error if the
backend has no shared mode.

=item slots => N

A semaphore of N slots (C<--slots N>, a whole number from 1 to 1024; anything else dies with
C<NetLock::Error::Usage> before anything is spawned): up to N holders at once, each in its
own slot (L</"slot, slot_count">). Every holder of one lock must ask for the same N:
another number while it is held dies with C<NetLock::Error::Config> and takes nothing.
C<shared> with more than one slot, or a backend without slots (the helper's README says
which have them), dies with C<NetLock::Error::Usage>. C<< slots => 1 >> is the plain lock.
Default: the profile's or the address's (C<?slots=N>), else 1. Each slot is a whole lock:
released on C<unlock> or process death, fencing tokens rising across slots.

=item fair => 1

Wait in the lock's fair queue (C<--fair>): waiters are served in the order they began to
wait, for one slot or several, on every backend. B<Every contender of the lock should say
it> (C<< fair => 1 >>, the profile's C<fair = true> or the address's C<?fair=true>): one
that does not is not in line and may go first. A waiter that gives up (its C<wait> runs
out) or whose process goes leaves the line at once; one killed leaves it as a dead holder
leaves a lock. C<locksmith --fair status LOCK> lists the line in order (C<status --json>:
C<"waiters">, by the helper's pid, C<helper_pid>). The helper keeps 1024 places in line
on the file backends, 32 on the network ones; more waiters wait for a place in no order. C<1> passes C<--fair>; C<0>, C<''> or undef (the
default) pass nothing, so the profile's or address's C<fair> stands; anything else
(C<'maybe'>, C<2>) dies with C<NetLock::Error::Usage> before anything is spawned.

=item helper => PATH

The C<locksmith> binary. Default: C<$LOCKSMITH_BIN>, else C<locksmith> on C<$PATH> (see
L</SECURITY>).

=back

=head2 try_new

    my $lock = NetLock->try_new($tag, %options) or print "busy\n";

Like C<new>, but returns C<undef> when the lock is busy. Tries once unless C<wait> is
given (then waits that long first). Other failures still die.

=head1 METHODS

=head2 unlock

Releases the lock and waits until it is really gone (the helper has exited). Returns 1 if
this call released it, 0 if it had been released already (as in the seed). Dies with a
C<NetLock::Error::Lost> if the helper said C<LOST>, or exited or was killed before being
asked (the critical section may have run unprotected), or with the class of its exit code
if the release itself failed (for example 74 when a network release could not complete).

=head2 token

The fencing token of this acquisition (C<token=> on the OK line) as a string of digits,
or undef if the backend keeps none. Each exclusive acquisition of a lock gets a larger
token than every earlier one; a shared one reports the last exclusive token. Compare
tokens numerically (C<E<lt>=E<gt>>; on 64-bit perls every token fits).

=head2 slot, slot_count

The semaphore slot held (C<slot=> on the OK line, from 0) and the lock's number of slots
(C<slots=>), for a lock of more than one slot (L</slots =E<gt> N>); undef for a lock of one
slot. B<Always undef for several locks>, as C<token> is: use C<slots> and C<slot_counts>.

=head2 prev_crashed

True if the previous acquisition did not end in a clean release (C<prev=crashed>): a
holder was killed, a machine lost, the lock broken. Its data may be half-written.

=head2 is_held

Whether the lock is still held, checked without blocking: false once the helper has
written C<LOST> (or anything unexpected) or has exited, or after C<unlock>. The answer can
be stale by the time you act on it; use C<token> where that matters.

=head2 lost

True once the lock was lost: the helper wrote C<LOST> (or anything unexpected), exited
before C<unlock>, or the release failed. False while it is held and after a clean C<unlock>.

=head2 check

Returns 1 if the lock is held, else dies with the C<NetLock::Error::Lost> that says why
(the helper's C<LOST> reason). Does not block. Handy between the steps of a long job.

=head2 wait_lost

    my $lost = $lock->wait_lost($timeout_seconds);   # undef: no limit

Blocks until the lock is lost (C<LOST>, or the helper exited) or the timeout passes;
returns 1 if lost, 0 on timeout. C<fileno> gives the descriptor to wait on yourself
(readable when the helper says something or exits; read nothing from it, call C<is_held>).

=head2 after_fork

    my $pid = fork;
    if ($pid == 0) { NetLock->after_fork; ... }

Class method, for a child made by C<fork>: closes this process's copies of the pipes of
every lock inherited from the parent, so that the parent's C<unlock> is not kept waiting
by this child (see L</RESOURCE LEAKING>). It never releases the parent's locks. C<new> and
C<try_new> call it. Returns how many locks it dropped.

=head2 profile, backend, is_shared, field, status_line, helper_pid

The profile as the helper echoed it, the backend (C<flock>, C<mkdir>, C<ftp>, ...),
whether the lock is shared (C<mode=shared>), any C<key=value> field of the OK line
(C<< $lock->field('since') >>), the whole OK line, and the helper's process id.

=head2 tokens, backends, slots, slot_counts, tags

    my @tokens = $set->tokens;     # (4, 9, undef): in the order named
    my @slots  = $set->slots;      # (undef, 1): the second lock is a semaphore

For a lock made from several names (L</SEVERAL LOCKS>), one entry per name given, in that
order: each lock's fencing token (undef where its backend keeps none), its backend, its
semaphore slot and number of slots (undef for a lock of one slot), and the names
themselves. (The C<slots> option is the number of slots; the C<slots> method lists the
slots held.) A name given twice appears twice. For a single lock, one entry each. They
return lists: in scalar context you get the count.

=head1 SEVERAL LOCKS

    my $set = NetLock->new([ 'db', 'mkdir:/srv/locks/cache' ], %options);
    my $set = NetLock->try_new([ 'db', 'cache' ]) or print "one of them is busy\n";

An array reference of names takes every lock as one set (SPEC 3b, C<locksmith hold A B ...>,
one helper): C<new> returns only once all are held, and C<unlock> or destruction releases
them all.

=over 4

=item *

All or nothing: if one lock is busy when the wait runs out (one C<wait> for the whole set)
or fails, the locks already taken are given back first, and C<new> dies with that lock's
error (C<NetLock::Error::Busy>: C<try_new> returns undef). Losing any one while held is
losing the set: C<is_held> turns false.

=item *

The helper takes the locks in one canonical order, holding each while it waits for the
next, so two programs naming the same locks in different orders never deadlock.

=item *

C<wait>, C<shared>, C<slots>, C<fair> and C<profiles> apply to every lock; an address's
own C<?wait=>, C<?slots=> or a profile's keys override them for that lock.

=item *

B<C<token> is undef for a set>, even when every lock has one: each lock has its own token
sequence, and one lock's token handed to another's server would fence the wrong writer. Use
C<tokens>. C<backend> is C<backend=> as written, comma-separated (C<mkdir,flock>);
C<profile> is the first name; C<is_shared> is true only if every lock is shared;
C<prev_crashed> if any lock's previous holder crashed.

=item *

The same name given twice is taken once. Two I<different> names for one lock (a profile and
its address) die with C<NetLock::Error::Usage>, after releasing: the helper takes that lock
once, and which token belongs to which name could not be told.

=back

=head1 ERRORS

Failures die with an object of a subclass of C<NetLock::Error>:

    NetLock::Error::Busy         busy         75   wait ran out (try_new returns undef)
    NetLock::Error::Config       config       78   profiles file, unknown profile, permissions
    NetLock::Error::Unavailable  unavailable  69   server unreachable, TLS failed
    NetLock::Error::Denied       denied       77   authentication, permission on the lock path
    NetLock::Error::Lost         lost         74   lock lost while held; release failed
    NetLock::Error::Usage        usage        64   bad argument or helper command line
    NetLock::Error::Io           io           74   I/O error on the lock path or the pipes
    NetLock::Error::Spawn        spawn             the helper could not be started
    NetLock::Error::Protocol     protocol          the helper said something unparseable

Each has C<kind> (the word above), C<message> (the helper's own words when it gave any)
and C<exit_code> (the helper's exit status, undef if it had not exited or a signal killed
it). An error stringifies as C<locksmith: KIND: MESSAGE> with a newline, so an uncaught
one reads well.

    if (my $err = $@) {
        if (ref $err && $err->isa('NetLock::Error::Config')) { ... }
        printf "%s (%s)\n", $err->message, $err->kind;
    }

=head1 RESOURCE LEAKING

=over 4

=item *

C<unlock> and C<DESTROY> both reap the helper, so no zombie is left. C<DESTROY> never
dies; it reports a failed release with C<warn>. Use C<unlock> to get the error instead.
C<DESTROY> runs when the last reference goes, which is the end of the enclosing block for
a C<my $lock> - unless C<my $lock = ...> is the block's last statement: perl then keeps
that value as the block's own and may destroy it later. Call C<unlock> when the moment
matters.

=item *

If this process exits, or is killed (even C<kill -9>), its pipe ends close and the helper,
which also watches its parent through a pidfd, releases at once.

=item *

If the helper is killed, nobody releases the lock: it becomes breakable as the backend
allows (C<flock> at once; C<mkdir>, C<link>, C<symlink> at once on same-host proof of
death, else after C<stale_after>). C<is_held> turns false and C<unlock> dies with
C<NetLock::Error::Lost>.

=item *

Our ends of the pipes are close-on-exec, so programs this process starts
(C<system>, C<exec>, piped C<open>) do not keep the lock alive. B<A child made by a bare
C<fork> shares them>: until it drops them, the helper does not see the parent's release,
and the parent's C<unlock> waits for that child. A child drops them when it exits or
execs, when it calls C<new> or C<try_new> (which drop every inherited lock first), when it
calls C<< NetLock->after_fork >> (do that first thing in a forked child that lives on), or
C<< $lock->unlock >> (which in a child only closes its copies and returns 0). C<DESTROY>
in a child only closes its copies. None of this ever releases the parent's lock.

=item *

While waiting for the helper, C<SIGCHLD> is set to its default so that a reaping
C<$SIG{CHLD}> handler cannot take the helper's exit status; a helper reaped by someone else
anyway (for example with C<$SIG{CHLD} = 'IGNORE'> while it died) makes C<unlock> die with
C<NetLock::Error::Io>.

=item *

A die from a signal handler while C<new> waits (the C<alarm> idiom) stops the helper
(it sees its pipes close and stops waiting) and reaps it before the die goes on.

=item *

B<A paused holder can be overtaken>: if the helper is stopped (C<SIGSTOP>, a VM pause)
longer than the profile's C<stale_after>, a waiter on another host may break the lock.
Pass C<token> to whatever you write to, so that it can refuse a stale writer.

=back

=head1 SECURITY

The helper is C<helper =E<gt>>, else C<$LOCKSMITH_BIN> (used as given: whoever can set
your environment or write that file decides what runs as you), else C<locksmith> in a
directory on C<$PATH> that is owned by root or you and writable by nobody else, as are the
file itself and its real location if it is a symlink (ancestor directories may be
world-writable only with the sticky bit, as C</tmp>). Empty and relative C<$PATH> entries
are skipped, and the directory of the script is never searched. Only the tag, the profiles
path, the wait, C<--shared>, C<--slots> and C<--fair> appear on the helper's command line
(visible in C<ps>).

=head1 SEE ALSO

The repository's F<README.md> and F<../shared/SPEC.md> (the pipe protocol, exit codes,
profiles); the Rust crate C<netlock> and the Python package C<netlock>, which keep the same
promises.

=cut

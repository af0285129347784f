package NetLockTest;

# Shared set-up for the tests: the real helper, a sandbox with a profiles file, and the
# checks every test file uses. The tests run against the real `locksmith` binary:
# $LOCKSMITH_BIN, else debug/locksmith in this repository's cargo target directory, found as
# cargo finds it (`cargo metadata`'s target_directory: $CARGO_TARGET_DIR, build.target-dir,
# else target/; `cargo build -p locksmith-helper` makes it). Without it they are skipped,
# except under CI=true, where a missing helper is a failure.

use strict;
use warnings;

use Cwd ();
use Exporter 'import';
use Fcntl qw(O_WRONLY O_CREAT O_EXCL);
use File::Temp ();
use FindBin ();
use JSON::PP ();
use POSIX ();
use Test::More ();

our @EXPORT_OK =
  qw(setup_helper find_helper cargo_target_dir sandbox no_children fake_helper write_file read_file dies_with);

# Every blocking call in the tests is bounded: the profiles say wait = "20s" unless a test
# passes its own wait, so a regression fails instead of hanging.
my $PROFILES = <<'TOML';
[defaults]
wait = "20s"

[profile.f]
backend = "flock"
path = "{dir}/f.lock"

[profile.m]
backend = "mkdir"
path = "{dir}/m.lock"

[profile.fast]
backend = "mkdir"
path = "{dir}/fast.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"
TOML

# Runs $code, which must die with an error of $class; returns that error.
sub dies_with {
    my ($code, $class, $name) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $ok  = eval { $code->(); 1 };
    my $err = $@;
    if ($ok) { Test::More::fail("$name: did not die"); return undef }
    Test::More::isa_ok($err, $class, $name) or Test::More::diag("got: $err");
    return $err;
}

sub repo_root { Cwd::abs_path("$FindBin::Bin/../../..") }

# This repository's cargo target directory, as cargo itself resolves it (`cargo metadata`);
# without cargo, $CARGO_TARGET_DIR (relative to the repository), else target/.
sub cargo_target_dir {
    my $root = repo_root();
    my $json = do {
        local $/;
        my $pid = open(my $fh, '-|') // return _target_fallback($root);
        if (!$pid) {
            open STDERR, '>', '/dev/null';
            open STDIN,  '<', '/dev/null';
            chdir $root or POSIX::_exit(1);
            exec 'cargo', qw(metadata --format-version 1 --no-deps --offline) or POSIX::_exit(127);
        }
        my $out = <$fh>;
        close $fh ? $out : undef;
    };
    my $meta = defined $json ? eval { JSON::PP::decode_json($json) } : undef;
    return ref $meta eq 'HASH' && defined $meta->{target_directory}
      ? $meta->{target_directory}
      : _target_fallback($root);
}

sub _target_fallback {
    my ($root) = @_;
    my $dir = $ENV{CARGO_TARGET_DIR} // 'target';
    return $dir =~ m{^/} ? $dir : "$root/$dir";
}

# The real helper: ($path, undef), or ($path, why it is not usable).
sub find_helper {
    my $bin = $ENV{LOCKSMITH_BIN} || cargo_target_dir() . '/debug/locksmith';
    return ($bin, undef) if -f $bin && -x _;
    return ($bin, "no locksmith helper at $bin (run `cargo build -p locksmith-helper`, or set LOCKSMITH_BIN)");
}

# Points NetLock at the real helper and quiets its stderr, or skips the whole file (dies
# under CI=true).
sub setup_helper {
    my ($bin, $why) = find_helper();
    if (defined $why) {
        die "$why\n" if ($ENV{CI} // '') eq 'true';
        Test::More::plan(skip_all => $why);
    }
    $ENV{LOCKSMITH_BIN} = Cwd::abs_path($bin);
    $ENV{LOCKSMITH_LOG} //= 'quiet';
    return $ENV{LOCKSMITH_BIN};
}

# A temporary directory (removed at exit) with a profiles file (mode 0600) naming locks
# inside it. Returns (dir, profiles file).
sub sandbox {
    my $dir = File::Temp::tempdir('netlock-pl-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    (my $text = $PROFILES) =~ s/\{dir\}/$dir/g;
    my $file = "$dir/profiles.toml";
    sysopen(my $fh, $file, O_WRONLY | O_CREAT | O_EXCL, 0600) or die "$file: $!";
    print {$fh} $text;
    close $fh or die "$file: $!";
    return ($dir, $file);
}

# No child process is left, running or zombie: every helper has been reaped.
sub no_children {
    my ($name) = @_;
    my $r = waitpid(-1, POSIX::WNOHANG());
    Test::More::ok($r == -1, $name // 'no child process left behind')
      or Test::More::diag("waitpid(-1, WNOHANG) returned $r");
}

# A fake helper: a shell script that acts by the tag's prefix (as the Rust client's
# unit tests do). Returns its path.
sub fake_helper {
    my ($dir) = @_;
    my $path = "$dir/fake-locksmith";
    write_file($path, <<'SH');
#!/bin/sh
for a in "$@"; do tag=$a; done
# The first lock named (the word after `hold`): the OK line's profile field for a set.
first=; after=
for a in "$@"; do
  if [ -n "$after" ] && [ -z "$first" ]; then first=$a; fi
  [ "$a" = hold ] && after=1
done
dir=$(dirname "$0")
printf '%s\n' "$@" > "$dir/$tag.args"
case $tag in
pair*)    echo "OK $first backend=fake,other mode=exclusive,shared token=5, locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
semset*)  echo "OK $first backend=fake,other token=5,6 slot=,2 slots=,3 locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
sem*)     echo "OK $tag backend=fake mode=exclusive token=7 slot=1 slots=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
merged*)  echo "OK $first backend=fake mode=exclusive token=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
busy*)    echo "ERROR busy: held by host=h pid=1 ppid=0"; exit 75 ;;
odd*)     echo "ERROR strange: what"; exit 78 ;;
quiet*)   exit 69 ;;
zero*)    exit 0 ;;
garbage*) echo "hello there"; exec cat >/dev/null ;;
other*)   echo "OK someone-else backend=fake"; exec cat >/dev/null ;;
lost*)    echo "OK $tag backend=fake mode=exclusive token=9"; echo "LOST server went away"; exit 74 ;;
early*)   echo "OK $tag backend=fake"; exit 0 ;;
relfail*) echo "OK $tag backend=fake"; cat >/dev/null; exit 74 ;;
*)        echo "OK $tag backend=fake mode=exclusive token=42 prev=crashed since=2025-01-01T00:00:00Z"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
esac
SH
    chmod 0755, $path or die "$path: $!";
    return $path;
}

sub write_file {
    my ($path, $text) = @_;
    open my $fh, '>', $path or die "$path: $!";
    print {$fh} $text;
    close $fh or die "$path: $!";
}

sub read_file {
    my ($path) = @_;
    open my $fh, '<', $path or die "$path: $!";
    local $/;
    return scalar <$fh>;
}

1;

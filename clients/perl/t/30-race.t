# The counter race: 4 processes x 100 increments of a counter file, each under the lock,
# read-modify-write with a truncating write; any overlap loses updates. It must end at
# exactly 400, on flock and on mkdir, and no clean release may be reported as a crash.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

use Fcntl ();
use POSIX ();
use Test::More;

use NetLock;
use NetLockTest qw(setup_helper sandbox no_children write_file read_file);

setup_helper();
my ($dir, $profiles) = sandbox();

my $PROCS  = 4;
my $ROUNDS = 100;

sub worker {
    my ($tag, $counter) = @_;
    my $crashed = 0;
    for (1 .. $ROUNDS) {
        my $lock = NetLock->new($tag, profiles => $profiles, wait => 60);
        $crashed++ if $lock->prev_crashed;
        open my $in, '<', $counter or die "$counter: $!";
        my $value = <$in>;
        close $in;
        open my $out, '>', $counter or die "$counter: $!";    # truncate, then write
        print {$out} $value + 1;
        close $out or die "$counter: $!";
        $lock->unlock;
    }
    return $crashed;
}

for my $tag (qw(f m)) {
    subtest "$PROCS processes x $ROUNDS increments under `$tag`" => sub {
        my $counter = "$dir/counter-$tag";
        write_file($counter, "0");
        my @kids;
        for (1 .. $PROCS) {
            my $pid = fork // die "fork: $!";
            if ($pid == 0) {
                my $crashed = eval { worker($tag, $counter) };
                if (!defined $crashed) {
                    print STDERR "worker $$: $@";
                    POSIX::_exit(1);
                }
                POSIX::_exit($crashed ? 2 : 0);
            }
            push @kids, $pid;
        }
        for my $pid (@kids) {
            waitpid $pid, 0;
            is($? >> 8, 0, "worker $pid finished, no prev_crashed after clean releases");
        }
        is(read_file($counter), $PROCS * $ROUNDS, 'the counter is exact');
        no_children();
    };
}

# The semaphore race (SPEC 3b): 6 processes x 8 rounds on a 2-slot lock, each holder
# marking its slot occupied with an O_EXCL file (two holders in one slot would fail) and
# adding 1 to that slot's counter, not atomically: the counters add up to exactly 48.
sub slot_worker {
    my ($lock, $base) = @_;
    for (1 .. 8) {
        my $held = NetLock->new($lock, slots => 2, wait => 60);
        my $k    = $held->slot;
        die 'no slot: ' . $held->status_line unless defined $k && $k =~ /^[01]\z/;
        sysopen(my $marker, "$base-$k.held", Fcntl::O_WRONLY() | Fcntl::O_CREAT() | Fcntl::O_EXCL())
          or die "two holders in slot $k: $!";
        close $marker;
        my $value = -e "$base-$k.count" ? read_file("$base-$k.count") : 0;
        write_file("$base-$k.count", $value + 1);
        unlink "$base-$k.held" or die "$base-$k.held: $!";
        $held->unlock;
    }
}

for my $lock ("$dir/sem-race", "mkdir:$dir/sem-race-m") {
    subtest "6 processes x 8 rounds on 2 slots of `$lock`" => sub {
        my $base = "$dir/slot-" . ($lock =~ /^mkdir:/ ? 'm' : 'f');
        my @kids;
        for (1 .. 6) {
            my $pid = fork // die "fork: $!";
            if ($pid == 0) {
                my $ok = eval { slot_worker($lock, $base); 1 };
                print STDERR "worker $$: $@" unless $ok;
                POSIX::_exit($ok ? 0 : 1);
            }
            push @kids, $pid;
        }
        for my $pid (@kids) {
            waitpid $pid, 0;
            is($? >> 8, 0, "worker $pid finished");
        }
        my $total = 0;
        $total += -e "$base-$_.count" ? read_file("$base-$_.count") : 0 for 0, 1;
        is($total, 48, 'the per-slot counters add up to 48');
        ok(!-e "$base-0.held" && !-e "$base-1.held", 'no slot left marked');
        no_children();
    };
}

done_testing;

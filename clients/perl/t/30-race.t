# The counter race: 4 processes x 100 increments of a counter file, each under the lock,
# read-modify-write with a truncating write; any overlap loses updates. It must end at
# exactly 400, on flock and on mkdir, and no clean release may be reported as a crash.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

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

done_testing;

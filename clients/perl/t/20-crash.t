# When things die: the helper killed (LOST, prev_crashed), the lock removed under a
# holder (LOST), the holding process killed (release), a die from a signal handler while
# waiting, a forked child. Waits are on the helper's lines and exits, never on sleeps.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

use File::Path ();
use POSIX ();
use Test::More;
use Time::HiRes ();

use NetLock;
use NetLockTest qw(setup_helper sandbox no_children dies_with);

setup_helper();
my ($dir, $profiles) = sandbox();
my %P = (profiles => $profiles);


subtest 'a killed helper: lost, and the next holder sees prev_crashed' => sub {
    my $first = NetLock->new('m', %P);
    ok($first->is_held, 'held');
    kill 'KILL', $first->helper_pid;
    ok($first->wait_lost(20), 'the helper\'s death is noticed');
    ok(!$first->is_held, 'is_held turns false');
    my $err = dies_with(sub { $first->unlock }, 'NetLock::Error::Lost', 'unlock after the helper died');
    if ($err) {
        like($err->message, qr/killed by signal 9/);
        ok(!defined $err->exit_code, 'no exit code for a signal');
    }
    # Same host: the dead holder's lock is broken by proof of death, not after stale_after.
    my $second = NetLock->new('m', %P, wait => 10);
    ok($second->prev_crashed, 'prev_crashed') or diag($second->status_line);
    cmp_ok($second->token, '>', $first->token, 'a larger token');
    $second->unlock;
    my $third = NetLock->new('m', %P);
    ok(!$third->prev_crashed, 'a clean release clears prev_crashed');
    cmp_ok($third->token, '>', $second->token);
    $third->unlock;
    no_children();
};

subtest 'LOST when the lock directory is removed' => sub {
    my $lock = NetLock->new('fast', %P);
    ok($lock->is_held, 'held');
    ok($lock->check, 'check passes while held');
    # Someone removes the lock under us: the next heartbeat (200 ms) says LOST.
    File::Path::rmtree("$dir/fast.lock");
    my $start = Time::HiRes::time();
    ok($lock->wait_lost(20), 'LOST arrives');
    cmp_ok(Time::HiRes::time() - $start, '<', 1.5, 'before stale_after');
    ok(!$lock->is_held, 'is_held is false');
    ok($lock->lost,     'lost is true');
    my $err = dies_with(sub { $lock->check }, 'NetLock::Error::Lost', 'check');
    like($err->message, qr/broken/, 'with the helper\'s reason') if $err;
    $err = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'unlock');
    is_deeply([ $err->kind, $err->exit_code ], [ 'lost', 74 ], 'kind lost, exit 74') if $err;
    no_children();
};

subtest 'is_held does not block' => sub {
    my $lock  = NetLock->new('m', %P);
    my $start = Time::HiRes::time();
    my $held  = 0;
    $held += $lock->is_held for 1 .. 1000;
    is($held, 1000, 'held every time');
    cmp_ok(Time::HiRes::time() - $start, '<', 1, '1000 checks in under a second');
    is($lock->wait_lost(0.05), 0, 'wait_lost with a timeout on a held lock: 0');
    $lock->unlock;
};

subtest 'the lock is released when its holder is killed' => sub {
    pipe(my $r, my $w) or die $!;
    pipe(my $block_r, my $block_w) or die $!;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $r;
        close $block_w;
        my $lock = eval { NetLock->new('m', %P) };
        syswrite $w, $lock ? 'held ' . $lock->token . "\n" : "error $@";
        sysread $block_r, my $buf, 1;    # until killed
        POSIX::_exit(0);
    }
    close $w;
    close $block_r;
    my $line = <$r>;
    like($line, qr/^held (\d+)$/, 'the child holds the lock');
    my ($token) = $line =~ /(\d+)/;
    ok(!defined NetLock->try_new('m', %P), 'so we cannot have it');
    kill 'KILL', $pid;
    waitpid $pid, 0;
    # Its helper sees its parent die and releases at once: a normal release.
    my $lock = NetLock->new('m', %P, wait => 10);
    ok(!$lock->prev_crashed, 'a parent\'s death is a clean release');
    cmp_ok($lock->token, '>', $token, 'a larger token');
    $lock->unlock;
    close $block_w;
    no_children();
};

subtest 'a die from a signal handler while waiting stops and reaps the helper' => sub {
    my $holder = NetLock->new('f', %P);
    my $ok     = eval {
        local $SIG{ALRM} = sub { die "timed out\n" };
        alarm 1;
        NetLock->new('f', %P, wait => 'forever');
        alarm 0;
        1;
    };
    alarm 0;
    ok(!$ok, 'new did not return');
    is($@, "timed out\n", 'the handler\'s die goes through');
    ok($holder->is_held, 'the holder is undisturbed');
    $holder->unlock;
    no_children('the waiting helper was reaped');
    my $next = NetLock->try_new('f', %P);
    ok($next, 'the interrupted waiter did not take the lock');
    $next->unlock;
};

subtest 'a forked child does not keep the parent\'s lock' => sub {
    my $lock = NetLock->new('f', %P);
    pipe(my $r, my $w) or die $!;
    pipe(my $go_r, my $go_w) or die $!;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $r;
        close $go_w;
        my $dropped = NetLock->after_fork;
        my $held    = $lock->is_held;
        my $unlock  = $lock->unlock;
        syswrite $w, "dropped=$dropped held=$held unlock=$unlock\n";
        sysread $go_r, my $buf, 1;    # live on until the parent is done
        POSIX::_exit(0);
    }
    close $w;
    close $go_r;
    is(scalar <$r>, "dropped=1 held=0 unlock=0\n",
        'the child dropped its copy; to it the lock is not held and not its to unlock');
    ok($lock->is_held, 'the parent still holds it');
    is($lock->unlock, 1, 'the parent releases while the child lives');
    my $next = NetLock->try_new('f', %P);
    ok($next, 'and the lock is free');
    $next->unlock;
    close $go_w;
    waitpid $pid, 0;
    is($?, 0, 'the child exited 0');
    no_children();
};

done_testing;

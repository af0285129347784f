# NetLock against the real locksmith helper, on flock and mkdir locks in a temporary
# directory: holding, releasing, busy, waiting, errors. Nothing here sleeps to
# synchronise: the tests wait on the helper's lines (new) or its exit (unlock).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

use Test::More;
use JSON::PP ();
use POSIX ();
use Time::HiRes ();

use NetLock;
use NetLockTest qw(setup_helper sandbox no_children write_file dies_with);

my $helper = setup_helper();
my ($dir, $profiles) = sandbox();
my %P = (profiles => $profiles);


subtest 'hold and unlock (flock)' => sub {
    my $lock = NetLock->new('f', %P);
    isa_ok($lock, 'NetLock');
    is($lock->profile,   'f');
    is($lock->backend,   'flock');
    is($lock->is_shared, 0);
    like($lock->token, qr/^[0-9]+$/, 'a fencing token');
    like($lock->status_line, qr/^OK f backend=flock /);
    ok($lock->is_held,  'held');
    ok(!$lock->lost,    'not lost');
    ok(!defined NetLock->try_new('f', %P), 'try_new: undef while someone holds it');
    ok($lock->is_held, 'a failed try did not disturb the holder');
    is($lock->unlock, 1, 'unlock');
    ok(!$lock->is_held, 'not held after unlock');
    ok(!$lock->lost, 'a clean unlock is not a loss');
    is($lock->wait_lost(0), 0, 'wait_lost on a cleanly released lock: 0 at once');
    is($lock->unlock, 0, 'a second unlock returns 0');
    my $again = NetLock->try_new('f', %P);
    ok($again, 'the lock is free as soon as unlock returned');
    $again->unlock;
    no_children();
};

subtest 'a lock address with a query: held and released' => sub {
    # Issue 25: the OK line's profile field is then the address, `?k=v` and all (spaces
    # and every other whitespace character written %XX per UTF-8 byte); it used to be
    # refused as "OK without a profile name".
    for my $name ('x', 'a b', "a\xc2\xa0b\xe2\x80\x83c") {
        my $address = "mkdir:$dir/$name?stale_after=30s";
        (my $shown = $address) =~ s/ /%20/g;
        $shown =~ s/\xc2\xa0/%C2%A0/g;
        $shown =~ s/\xe2\x80\x83/%E2%80%83/g;
        my $lock = eval { NetLock->new($address, wait => 20) };
        ok($lock, "$address: taken") or diag($@), next;
        is($lock->profile, $shown, 'the profile is the address as the helper shows it');
        is($lock->backend, 'mkdir');
        like($lock->token, qr/^[0-9]+$/, 'a fencing token');
        ok($lock->is_held, 'held');
        ok(-d "$dir/$name", 'the lock directory exists while held');
        ok(!defined NetLock->try_new($address), 'try_new: undef while someone holds it');
        is($lock->unlock, 1, 'unlock');
        ok(!-e "$dir/$name", 'the lock directory is gone when unlock returns');
        my $again = NetLock->try_new($address);
        ok($again, 'the lock is free as soon as unlock returned');
        $again->unlock if $again;
    }
    no_children();
};

subtest 'unlock returns once the lock is gone (mkdir)' => sub {
    my $lock = NetLock->new('m', %P);
    is($lock->backend, 'mkdir');
    ok(-d "$dir/m.lock", 'the lock directory exists while held');
    $lock->unlock;
    ok(!-e "$dir/m.lock", 'and is gone when unlock returns');
    no_children();
};

subtest 'release on DESTROY' => sub {
    {
        my $lock = NetLock->new('m', %P);
        ok(-d "$dir/m.lock", 'held inside the block');
    }
    ok(!-e "$dir/m.lock", 'released as the object went out of scope');
    my $lock = NetLock->new('f', %P);
    undef $lock;
    my $next = NetLock->try_new('f', %P);
    ok($next, 'undef $lock released it');
    $next->unlock;
    # An exception leaving the scope releases too.
    eval {
        my $l = NetLock->new('m', %P);
        die "boom\n";
    };
    is($@, "boom\n");
    ok(!-e "$dir/m.lock", 'a die through the scope released it');
    no_children();
};

subtest 'a lock held in a global is released at exit, quietly' => sub {
    my $lib = "$FindBin::Bin/../lib";
    my $out = `$^X -I$lib -MNetLock -e 'our \$l = NetLock->new("m", profiles => "$profiles"); print "held\n"' 2>&1`;
    is($?,   0,        'the script exited 0');
    is($out, "held\n", 'no warning or error at global destruction');
    ok(!-e "$dir/m.lock", 'DESTROY at exit released the lock before the script ended');
    no_children();
};

subtest 'busy: try_new and wait' => sub {
    my $holder = NetLock->new('f', %P);
    ok(!defined NetLock->try_new('f', %P),               'try_new: undef');
    ok(!defined NetLock->try_new('f', { %P, wait => 0.1 }), 'try_new with a wait: undef after it');
    for my $wait (0.3, '300ms') {
        my $start = Time::HiRes::time();
        my $err   = dies_with(sub { NetLock->new('f', %P, wait => $wait) },
            'NetLock::Error::Busy', "wait => $wait");
        my $took = Time::HiRes::time() - $start;
        next unless $err;
        is($err->kind,      'busy');
        is($err->exit_code, 75);
        like($err->message, qr/held by/, 'names the holder');
        like("$err", qr/^locksmith: busy: /);
        cmp_ok($took, '>=', 0.3, 'gave up only after the wait');
    }
    ok($holder->is_held, 'the holder still holds');
    $holder->unlock;
    no_children();
};

subtest 'a waiter gets the lock when it is released' => sub {
    my $holder = NetLock->new('m', %P);
    pipe(my $r, my $w) or die $!;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close $r;
        my $status = eval {
            syswrite $w, "waiting\n";
            my $l = NetLock->new('m', %P, wait => 20);
            syswrite $w, "got " . $l->token . "\n";
            $l->unlock;
            0;
        } // do { syswrite $w, "error $@"; 1 };
        POSIX::_exit($status);
    }
    close $w;
    is(scalar <$r>, "waiting\n", 'the child waits');
    $holder->unlock;
    my $got = <$r>;
    like($got, qr/^got (\d+)$/, 'the child got the lock');
    cmp_ok(($got =~ /(\d+)/)[0], '>', $holder->token, 'with a larger token');
    waitpid $pid, 0;
    is($?, 0, 'the child exited 0');
    no_children();
};

subtest 'errors by kind' => sub {
    my $err = dies_with(sub { NetLock->new('nope', %P) }, 'NetLock::Error::Config', 'unknown profile');
    if ($err) {
        is($err->kind,      'config');
        is($err->exit_code, 78);
        like($err->message, qr/unknown profile/);
    }
    dies_with(sub { NetLock->try_new('nope', %P) }, 'NetLock::Error::Config', 'try_new: only busy is undef');
    $err = dies_with(sub { NetLock->new('f', profiles => "$dir/missing.toml") },
        'NetLock::Error::Config', 'missing profiles file');
    $err = dies_with(sub { NetLock->new('m', %P, shared => 1) }, 'NetLock::Error::Usage',
        'mkdir has no shared mode');
    is_deeply([ $err->kind, $err->exit_code ], [ 'usage', 64 ]) if $err;
    $err = dies_with(sub { NetLock->new('-v', %P) }, 'NetLock::Error::Usage', 'a tag like an option');
    ok(!defined $err->exit_code, 'refused before anything was spawned') if $err;
    $err = dies_with(sub { NetLock->new('f', %P, helper => "$dir/no-such-locksmith") },
        'NetLock::Error::Spawn', 'a missing helper');
    is($err->kind, 'spawn') if $err;
    {
        local $ENV{LOCKSMITH_BIN} = "$dir/nope";
        dies_with(sub { NetLock->new('f', %P) }, 'NetLock::Error::Spawn',
            '$LOCKSMITH_BIN naming a missing file does not fall through');
    }
    no_children();
};

subtest 'shared locks (flock)' => sub {
    my $r1 = NetLock->new('f', %P, shared => 1);
    my $r2 = NetLock->try_new('f', %P, shared => 1);
    ok($r2, 'two readers hold together');
    ok($r1->is_shared && $r2->is_shared, 'both shared');
    ok(!defined NetLock->try_new('f', %P), 'a writer does not get in beside readers');
    $r1->unlock;
    $r2->unlock;
    my $w = NetLock->try_new('f', %P);
    ok($w && !$w->is_shared, 'a writer after the readers left');
    $w->unlock;
};

subtest 'tokens increase, prev_crashed stays false after clean releases' => sub {
    my (@m, @f);
    for my $tag (qw(m m m f f)) {
        my $lock = NetLock->new($tag, %P);
        ok(!$lock->prev_crashed, "clean release before this $tag");
        push @{ $tag eq 'm' ? \@m : \@f }, $lock->token;
        $lock->unlock;
    }
    ok($m[0] < $m[1] && $m[1] < $m[2], "mkdir tokens strictly increase: @m");
    ok($f[0] < $f[1], "flock tokens strictly increase: @f");
};

# -- several locks at once (SPEC 3b) ---------------------------------------------------

# Whether $lock is free now: `locksmith status LOCK` exits 0 for a free lock, 1 for a held one.
sub free {
    my ($lock) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN,  '<', '/dev/null';
        open STDOUT, '>', '/dev/null';
        exec $helper, '--profiles', $profiles, 'status', $lock or POSIX::_exit(127);
    }
    waitpid $pid, 0;
    my $code = $? >> 8;
    die "status $lock: exit $code" unless $code == 0 || $code == 1;
    return $code == 0;
}

# An mkdir: address and a plain path (a flock file), two backends, fresh for each subtest.
sub two_locks { my ($name) = @_; ("mkdir:$dir/$name-m", "$dir/$name-f.lock") }

subtest 'several locks: held together, released by unlock and by destruction' => sub {
    my ($M, $F) = two_locks('s1');
    my $set = NetLock->new([ $M, $F ], wait => 20);
    is_deeply([ $set->tags ],     [ $M, $F ]);
    is_deeply([ $set->backends ], [ 'mkdir', 'flock' ]);
    # A file backend's first token is the clock's floor (issue 28: its state may be cleaned away).
    my @t = $set->tokens;
    ok(@t == 2 && $t[0] > 1 && $t[1] > 1, 'a token for each') or diag($set->status_line);
    ok(!defined $set->token, 'one token cannot stand for the set');
    is($set->profile, $M, 'the profile is the first lock named');
    ok($set->is_held, 'held');
    ok(-d "$dir/s1-m", 'the mkdir lock exists while held');
    ok(!free($M) && !free($F), 'both held');
    ok(!defined NetLock->try_new($F), 'try_new of one of them: undef');
    is($set->unlock, 1, 'unlock');
    ok(free($M) && free($F), 'every lock is gone when unlock returns');
    {
        my $scoped = NetLock->new([ 'm', $F ], %P);    # a profile and an address
        is_deeply([ $scoped->backends ], [ 'mkdir', 'flock' ]);
        ok(!free('m') && !free($F), 'both held');
        undef $scoped;
    }
    ok(free('m') && free($F), 'destruction released every lock');
    no_children();
};

subtest 'several locks: tokens in the order named' => sub {
    my ($M, $F) = two_locks('s2');
    # $M alone twice (its first token: the clock's floor, issue 28): the two locks' tokens
    # differ from here on.
    my $first_m;
    for my $i (0, 1) {
        my $one = NetLock->new($M, wait => 20);
        $first_m //= $one->token;
        is_deeply([ $one->token, $one->tokens ], [ $first_m + $i, $first_m + $i ]);
        $one->unlock;
    }
    my $set = NetLock->new([ $M, $F ], wait => 20);
    my $first_f = ($set->tokens)[1];    # flock's first token: the clock's floor (issue 28)
    is(($set->tokens)[0], $first_m + 2, "$M then $F") or diag($set->status_line);
    $set->unlock;
    $set = NetLock->new([ $F, $M ], wait => 20);
    is_deeply([ $set->tokens ], [ $first_f + 1, $first_m + 3 ], "$F then $M")
      or diag($set->status_line);
    is_deeply([ $set->backends ], [ 'flock', 'mkdir' ]);
    $set->unlock;
    no_children();
};

subtest 'several locks: the same lock twice' => sub {
    my ($M, $F) = two_locks('s3');
    my $set = NetLock->new([ $M, $F, $M ], wait => 20);
    my ($first_m, $first_f) = $set->tokens;    # the clocks' floors (issue 28)
    is_deeply([ $set->tokens ],   [ $first_m, $first_f, $first_m ], 'taken once, its token in both places')
      or diag($set->status_line);
    is_deeply([ $set->backends ], [ 'mkdir', 'flock', 'mkdir' ]);
    is($set->field('locks'), 2);
    $set->unlock;
    $set = NetLock->new([ $F, $F ], wait => 20);
    ok(!defined $set->field('locks'), 'one name twice: a single lock') or diag($set->status_line);
    is_deeply([ $set->token, $set->tokens ], [ ($first_f + 1) x 3 ]);
    $set->unlock;
    my $err = dies_with(sub { NetLock->new([ $F, $M, "flock:$F" ], wait => 20) },
        'NetLock::Error::Usage', 'two names for one lock');
    like($err->message, qr/name each lock once/) if $err;
    ok(free($M) && free($F), 'a refused set left nothing held');
    no_children();
};

subtest 'several locks: one busy is a busy set, and nothing is held' => sub {
    my ($M, $F) = two_locks('s4');
    my $z = "mkdir:$dir/s4-z";
    for my $busy ($M, $F) {
        my $holder = NetLock->new($busy, wait => 20);
        ok(!defined NetLock->try_new([ $z, $M, $F ]), "$busy held: try_new of the set is undef");
        my $err = dies_with(sub { NetLock->new([ $M, $F, $z ], wait => 0.2) },
            'NetLock::Error::Busy', "$busy held: new of the set dies busy");
        is($err->exit_code, 75) if $err;
        ok($holder->is_held, 'the holder was not disturbed');
        ok(free($_), "$_ left free after the set failed on $busy") for grep { $_ ne $busy } $M, $F, $z;
        $holder->unlock;
    }
    my $set = NetLock->try_new([ $M, $F, $z ]);
    ok($set, 'the set is free once the holder let go');
    $set->unlock if $set;
    no_children();
};

subtest 'several locks: addresses with queries and spaces' => sub {
    my ($M, $F) = two_locks('s5');
    my $q      = "mkdir:$dir/s5-q?stale_after=30s";
    my $spaced = "mkdir:$dir/s5 b?stale_after=30s&poll=50ms";
    for my $pair ([ $q, $F ], [ $spaced, $q ], [ $F, $spaced ]) {
        my ($first, $second) = @$pair;
        (my $shown = $first) =~ s/ /%20/g;
        my $set = eval { NetLock->new([ $first, $second ], wait => 20) };
        ok($set, "$first + $second: taken") or diag($@), next;
        is($set->profile, $shown);
        is(scalar(grep { defined && /^[0-9]+$/ } $set->tokens), 2, 'a token for each');
        ok(!free($first) && !free($second), 'both held');
        $set->unlock;
        ok(free($first) && free($second), 'both released');
    }
    no_children();
};

# Semaphores (SPEC 3b, --slots N): two holders of a 2-slot lock hold slots 0 and 1, a third
# is busy, giving one back lets the third in, in the slot freed; tokens rise across slots.
sub two_slots_then_busy_then_the_freed_slot {
    my ($lock) = @_;
    my $one = NetLock->new($lock, slots => 2, wait => 20);
    my $two = NetLock->new($lock, slots => 2, wait => 20);
    is_deeply([ sort { $a <=> $b } $one->slot, $two->slot ], [ 0, 1 ], 'slots 0 and 1')
      or diag($one->status_line, ' / ', $two->status_line);
    is_deeply([ $one->slot_count, $two->slot_count ], [ 2, 2 ]);
    is_deeply([ $one->slots ], [ $one->slot ], 'slots: one entry for one lock');
    like($one->status_line, qr/ slot=[01] slots=2/);
    cmp_ok($two->token, '>', $one->token, 'tokens rise across slots');
    ok(!defined NetLock->try_new($lock, slots => 2), 'a third holder of 2 slots is busy');
    my $e = dies_with(sub { NetLock->new($lock, slots => 2, wait => 0) }, 'NetLock::Error::Busy', 'busy');
    is($e->exit_code, 75) if $e;
    my $freed = $one->slot;
    $one->unlock;
    my $c = NetLock->new($lock, slots => 2, wait => 20);
    is($c->slot, $freed, 'the third takes the slot given back');
    cmp_ok($c->token, '>', $two->token);
    ok($two->is_held && $c->is_held, 'both held');
    $two->unlock;
    $c->unlock;
    my ($d, $f) = (NetLock->try_new($lock, slots => 2), NetLock->try_new($lock, slots => 2));
    ok($d && $f && $d->slot != $f->slot, 'both slots free again');
    $_->unlock for $d, $f;
    no_children();
}

subtest 'slots: two holders of two slots and no more (flock)' => sub {
    two_slots_then_busy_then_the_freed_slot("$dir/gpu-f");
};

subtest 'slots: two holders of two slots and no more (mkdir)' => sub {
    two_slots_then_busy_then_the_freed_slot("mkdir:$dir/gpu-m");
};

subtest 'slots: none, or 1, report no slot' => sub {
    my $lock = NetLock->new('f', %P);
    ok(!defined $lock->slot && !defined $lock->slot_count, 'no slot');
    is_deeply([ $lock->slots ], [undef]);
    $lock->unlock;
    $lock = NetLock->new('f', %P, slots => 1);
    ok(!defined $lock->slot, 'slots => 1: the plain lock');
    unlike($lock->status_line, qr/ slot=/);
    ok(!defined NetLock->try_new('f', %P, slots => 1), 'and busy for another');
    $lock->unlock;
};

subtest 'slots: bad values refused before spawning' => sub {
    for my $bad (0, 1025, 'x', '1.5', -1) {
        my $e = dies_with(sub { NetLock->new('/tmp/never-taken', slots => $bad, helper => '/nonexistent/locksmith') },
            'NetLock::Error::Usage', "slots => $bad");
        ok($e && !defined $e->exit_code, 'nothing ran');
        dies_with(sub { NetLock->try_new('/tmp/never-taken', slots => $bad, helper => '/nonexistent/locksmith') },
            'NetLock::Error::Usage', "try_new slots => $bad");
    }
    no_children();
};

subtest 'slots: another number is a config error and takes nothing; shared is a usage error' => sub {
    my $lock = "$dir/sem-x";
    my $held = NetLock->new($lock, slots => 2, wait => 20);
    my $e = dies_with(sub { NetLock->new($lock, slots => 3, wait => 0) }, 'NetLock::Error::Config', '2 vs 3');
    is($e->exit_code, 78) if $e;
    my $other = NetLock->try_new($lock, slots => 2);
    ok($other, 'the refused contender took nothing: the second slot is free');
    $other->unlock if $other;
    $e = dies_with(sub { NetLock->new($lock, slots => 2, shared => 1, wait => 0) }, 'NetLock::Error::Usage', 'shared');
    is($e->exit_code, 64) if $e;
    $held->unlock;
    no_children();
};

subtest 'slots: a set where one lock has slots' => sub {
    my $sem   = "flock:$dir/sem?slots=2";
    my $plain = "mkdir:$dir/sem-plain";
    my $set   = NetLock->new([ $plain, $sem ], wait => 20);
    my @slots = $set->slots;
    ok(!defined $slots[0], 'the plain lock has no slot') or diag($set->status_line);
    ok(defined $slots[1] && $slots[1] =~ /^[01]\z/, 'the semaphore has one');
    is_deeply([ $set->slot_counts ], [ undef, 2 ]);
    ok(!defined $set->slot && !defined $set->slot_count, 'one slot cannot stand for a set');
    ok(!defined NetLock->try_new($plain), 'the plain lock is held');
    my $other = NetLock->try_new($sem);
    is($other && $other->slot, 1 - $slots[1], 'the semaphore had one more slot');
    ok(!defined NetLock->try_new($sem), 'and no more');
    $other->unlock if $other;
    $set->unlock;
    # slots => 2 on a set applies to every lock.
    my ($x, $y) = ("$dir/sem-a", "mkdir:$dir/sem-b");
    my $first  = NetLock->new([ $x, $y ], slots => 2, wait => 20);
    my $second = NetLock->new([ $y, $x ], slots => 2, wait => 20);
    is_deeply([ $first->slot_counts ], [ 2, 2 ]);
    my @f = $first->slots;
    my @s = $second->slots;
    ok($f[0] != $s[1] && $f[1] != $s[0], 'two holders of each, in two slots');
    ok(!defined NetLock->try_new($x, slots => 2), 'full');
    $_->unlock for $first, $second;
    no_children();
};

# Fair queues (--fair, SPEC 3b).

# The waiters in $lock's fair queue as `locksmith [--fair] status --json LOCK` lists them:
# their pids (each a NetLock's helper), in order.
sub line_of {
    my ($lock, $fair_flag) = @_;
    my @cmd = ($helper, ($fair_flag ? '--fair' : ()), 'status', '--json', $lock);
    open(my $out, '-|', @cmd) or die "@cmd: $!";
    my $json = do { local $/; <$out> };
    close $out;
    my $code = $? >> 8;
    die "@cmd: exit $code: $json" unless $code == 0 || $code == 1;    # 0 free, 1 held
    return map { $_->{pid} } @{ JSON::PP::decode_json($json)->{waiters} };
}

# $holder holds $lock; $n children each take it with NetLock->new($lock, %opts), beginning to
# wait one after another, each seen in line (status --json) before the next starts; then the
# holder lets go. Each child, once it holds the lock, writes "I HELPER_PID" to a pipe and lets
# go: the lines come in the order they were served, which must be the order they came, pid
# for pid.
sub served_in_order {
    my ($lock, $holder, $n, $fair_flag, %opts) = @_;
    pipe(my $r, my $w) or die $!;
    my (@children, @line);
    for my $i (1 .. $n) {
        my $pid = fork // die "fork: $!";
        if ($pid == 0) {
            close $r;
            my $status = eval {
                my $l = NetLock->new($lock, %opts, wait => 60);
                syswrite $w, "$i " . $l->helper_pid . "\n";
                $l->unlock;
                0;
            } // do { syswrite $w, "error $@\n"; 1 };
            POSIX::_exit($status);
        }
        push @children, $pid;
        my $deadline = Time::HiRes::time() + 30;
        my @now;
        while (1) {
            @now = line_of($lock, $fair_flag);
            last if @now > @line || Time::HiRes::time() > $deadline;
            Time::HiRes::sleep(0.02);
        }
        is(scalar @now, @line + 1, "waiter $i is in line") or diag("line: @now");
        is_deeply([ @now[ 0 .. $#line ] ], \@line, 'the line keeps its order');
        @line = @now;
    }
    close $w;
    $holder->unlock;
    my @served = map { scalar <$r> } 1 .. $n;
    chomp @served;
    is_deeply(\@served, [ map { "$_ $line[$_ - 1]" } 1 .. $n ], 'served in the order they came');
    for my $pid (@children) {
        waitpid $pid, 0;
        is($?, 0, "waiter $pid exited 0");
    }
    is_deeply([ line_of($lock, $fair_flag) ], [], 'nobody left in line');
}

for my $case ([ flock => "$dir/deploy-f" ], [ mkdir => "mkdir:$dir/deploy-m" ]) {
    my ($backend, $lock) = @$case;
    subtest "fair: waiters served in the order they came ($backend)" => sub {
        my $holder = NetLock->new($lock, fair => 1, wait => 20);
        served_in_order($lock, $holder, 3, 1, fair => 1);
        no_children();
    };
}

subtest 'fair: a waiter that gives up leaves the line' => sub {
    # Its wait runs out: Busy, and it is gone from the line at once; the one behind it keeps
    # its place and gets the lock when the holder lets go.
    my $lock   = "mkdir:$dir/fair-quit";
    my $holder = NetLock->new($lock, fair => 1, wait => 20);
    pipe(my $r, my $w) or die $!;
    my @children;
    for my $wait (3, 60) {
        my $pid = fork // die "fork: $!";
        if ($pid == 0) {
            close $r;
            my $l = eval { NetLock->new($lock, fair => 1, wait => $wait) };
            my $said = $l ? 'got ' . $l->helper_pid : ref $@;
            syswrite $w, "$said\n";
            $l->unlock if $l;
            POSIX::_exit(0);
        }
        push @children, $pid;
        my $deadline = Time::HiRes::time() + 30;
        Time::HiRes::sleep(0.02) until line_of($lock, 1) == @children || Time::HiRes::time() > $deadline;
    }
    my @line = line_of($lock, 1);
    is(scalar @line, 2, 'both in line') or diag("line: @line");
    is(scalar <$r>, "NetLock::Error::Busy\n", 'the first gave up');
    waitpid $children[0], 0;
    is_deeply([ line_of($lock, 1) ], [ $line[1] ], 'and left the line');
    $holder->unlock;
    is(scalar <$r>, "got $line[1]\n", 'the next in line got it');
    waitpid $children[1], 0;
    is_deeply([ line_of($lock, 1) ], [], 'nobody left in line');
    no_children();
};

subtest 'fair: ?fair=true&slots=2 in an address puts plain locks in line' => sub {
    my $lock = "mkdir:$dir/fx?fair=true&slots=2";
    my ($first, $second) = map { NetLock->new($lock, wait => 20) } 1, 2;
    is($first->profile, $lock);
    is_deeply([ $first->slot_count, $second->slot_count ], [ 2, 2 ]);
    served_in_order($lock, $first, 3, 0);
    ok($second->is_held, 'the other slot was held all along');
    $second->unlock;
    no_children();
};

subtest 'fair: not a boolean is refused before spawning' => sub {
    for my $bad ('maybe', 'yes', 2, -1, [1]) {
        my $e = dies_with(sub { NetLock->new('/tmp/never-taken', fair => $bad, helper => '/nonexistent/locksmith') },
            'NetLock::Error::Usage', "fair => $bad");
        ok($e && !defined $e->exit_code, 'nothing ran');
        like($e->message, qr/expected 1 or 0/) if $e;
        dies_with(sub { NetLock->try_new('/tmp/never-taken', fair => $bad, helper => '/nonexistent/locksmith') },
            'NetLock::Error::Usage', "try_new fair => $bad");
    }
    no_children();
};

subtest 'the helper found on $PATH' => sub {
    mkdir "$dir/bin", 0755 or die $!;
    chmod 0755, "$dir/bin";
    write_file("$dir/bin/locksmith", qq{#!/bin/sh\nexec "$helper" "\$@"\n});
    chmod 0755, "$dir/bin/locksmith";
    local $ENV{LOCKSMITH_BIN} = '';
    local $ENV{PATH}          = "relative/dir:$dir/bin:/usr/bin:/bin";
    my $lock = NetLock->new('f', %P);
    is($lock->backend, 'flock', 'found and ran it');
    $lock->unlock;
    chmod 0777, "$dir/bin";
    my $err = dies_with(sub { NetLock->new('f', %P) }, 'NetLock::Error::Spawn',
        'not from a directory others can write');
    like($err->message, qr/writable by group or others/) if $err;
    chmod 0755, "$dir/bin";
    no_children();
};

done_testing;

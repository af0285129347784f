# The parts that need no real helper: line parsing, argument building, helper lookup,
# and the guard against a fake helper (a shell script that acts by the tag's prefix).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

use File::Temp ();
use Test::More;

use NetLock;
use NetLockTest qw(no_children fake_helper write_file read_file dies_with find_helper cargo_target_dir);


subtest 'OK lines' => sub {
    my $line = 'OK deploy backend=etcd mode=exclusive token=18446744073709551615 since=2025-01-02T03:04:05Z';
    my $ok = NetLock::_parse_line($line);
    is($ok->{type},          'OK');
    is($ok->{raw},           $line);
    is($ok->{profile},       'deploy');
    is($ok->{map}{backend},  'etcd');
    is($ok->{token},         '18446744073709551615', 'a u64 token, kept exact');
    is($ok->{map}{since},    '2025-01-02T03:04:05Z');
    $ok = NetLock::_parse_line("OK  demo   backend=flock token=003 \r");
    is($ok->{profile}, 'demo', 'extra whitespace and a CR are tolerated');
    is($ok->{token},   '3');
    ok(!defined NetLock::_parse_line('OK x backend=flock')->{token}, 'no token');
    for my $bad (
        'OK', 'OK backend=flock', 'OK demo', 'OK demo backend=', 'OK demo backend=flock junk',
        'OK demo backend=flock =x', 'OK demo backend=flock backend=mkdir',
        'OK demo backend=flock mode=weird', 'OK demo backend=flock token=-1',
        'OK demo backend=flock token=18446744073709551616',
      )
    {
        dies_with(sub { NetLock::_parse_line($bad) }, 'NetLock::Error::Protocol', $bad);
    }
};

subtest 'OK lines with slots' => sub {
    # SPEC 3b semaphores: slot=K slots=N; for several locks one value each, both empty for
    # a lock of one slot.
    my $ok = NetLock::_parse_line('OK /tmp/x backend=flock mode=exclusive token=2 slot=1 slots=2');
    is_deeply([ @{$ok}{qw(slot slot_count token)} ], [ 1, 2, 2 ]);
    $ok = NetLock::_parse_line('OK /tmp/x backend=flock mode=exclusive token=2');
    ok(!defined $ok->{slot} && !defined $ok->{slot_count}, 'no slot without slots=');
    $ok = NetLock::_parse_line('OK a backend=mkdir,flock token=1,2 slot=1, slots=2, locks=2');
    is_deeply([ map { [ $_->{slot}, $_->{slots} ] } @{ $ok->{locks} } ], [ [ 1, 2 ], [ undef, undef ] ]);
    ok(!defined $ok->{slot}, 'one slot cannot stand for a set');
    $ok = NetLock::_parse_line('OK a backend=flock,flock slot=0,1023 slots=3,1024 locks=2');
    is_deeply([ @{ $ok->{locks}[1] }{qw(slot slots)} ], [ 1023, 1024 ]);
    for my $bad (
        'OK a backend=flock slot=1',
        'OK a backend=flock slots=2',
        'OK a backend=flock slot=2 slots=2',
        'OK a backend=flock slot= slots=2',
        'OK a backend=flock slot=x slots=2',
        'OK a backend=flock slot=-1 slots=2',
        'OK a backend=flock slot=+1 slots=2',
        'OK a backend=flock slot=0 slots=4294967296',
        'OK a backend=flock slot=0 slots=0',
        'OK a backend=flock,flock slot=0 slots=2, locks=2',
        'OK a backend=flock,flock slot=0, slots=2 locks=2',
        'OK a backend=flock,flock slot=0,1 slots=2,2,2 locks=2',
        'OK a backend=flock,flock slot=,1 slots=2, locks=2',
      )
    {
        dies_with(sub { NetLock::_parse_line($bad) }, 'NetLock::Error::Protocol', $bad);
    }
};

# A lock address as the helper echoes it (SPEC 3a: as given, spaces written %20): a scheme
# or a bare path, parts with ':', '=', '%20', and often a query '?k=v&k=v'.
sub random_address {
    my $pick   = sub { $_[ int rand @_ ] };
    my $scheme = $pick->(
        qw(mkdir: flock: link: symlink: postgres:// postgresql:// ftp:// ftps:// etcd:// s3:// redis:// / ./)
    );
    my @parts = (
        qw(tmp a x.lock / %20 : = db.example:5432 h:2379,h2:2379 app locks %2F a%20b x=y @ - _),
        "\xc3\xa9"
    );
    my $addr = $scheme . join '', map { $pick->(@parts) } 1 .. 1 + int rand 5;
    if (rand() < 0.8) {
        my @keys   = (qw(lock stale_after wait shared slots fair key endpoint tls k), '');
        my @values = (qw(30s 0 true py 3 http://127.0.0.1:9000 /etc/ca.pem a%20b x=y == ? :), '');
        my @pairs  = map { $pick->(@keys) . $pick->(qw(= = = ==), '') . $pick->(@values) } 1 .. int rand 4;
        $addr .= $pick->(qw(? ? ? ?? ?&)) . join '&', @pairs;
    }
    return $addr;
}

subtest 'OK lines naming a lock address with a query' => sub {
    # Issue 25: the profile field is the first word after OK, `?k=v` and all.
    for my $case (
        [ 'OK mkdir:/x?stale_after=30s backend=mkdir mode=exclusive token=1', 'mkdir:/x?stale_after=30s' ],
        [ 'OK postgres://db:5432/app?lock=py backend=postgres', 'postgres://db:5432/app?lock=py' ],
        [ 'OK mkdir:/a%20b?stale_after=30s&wait=0 backend=mkdir token=2', 'mkdir:/a%20b?stale_after=30s&wait=0' ],
        [ 'OK backend=flock backend=flock', 'backend=flock' ],
        [ 'OK = backend=flock', '=' ],
      )
    {
        my ($line, $profile) = @$case;
        my $ok = eval { NetLock::_parse_line($line) };
        is($ok && $ok->{profile}, $profile, $line) or diag($@);
        is($ok && scalar @{ $ok->{fields} }, scalar(split / /, $line) - 2, "$line: fields");
    }
    my $q = eval { NetLock::_parse_line('OK mkdir:/x?stale_after=30s backend=mkdir') };
    ok($q && !exists $q->{map}{stale_after}, 'the query is not read as a field');

    # A seeded random loop: OK lines as the helper writes them, the profile a name or an
    # address with ?, =, :, %20 in it, every field back. NETLOCK_TEST_SEED picks another
    # seed, NETLOCK_TEST_CASES a longer run.
    my $seed  = $ENV{NETLOCK_TEST_SEED}  // 25;
    my $cases = $ENV{NETLOCK_TEST_CASES} // 3000;
    srand($seed);
    my $flat = sub { join "\0", map { "$_->[0]=$_->[1]" } @{ $_[0] } };
    my @failed;
    for my $i (1 .. $cases) {
        my $profile =
          rand() < 0.7
          ? random_address()
          : join '', map { ('a' .. 'z', 'A' .. 'Z', 0 .. 9, '.', '_', '-')[ int rand 65 ] } 1 .. 1 + int rand 64;
        my @fields = ([ backend => (qw(flock mkdir postgres x))[ int rand 4 ] ]);
        push @fields, [ mode => (qw(exclusive shared))[ int rand 2 ] ] if rand() < 0.7;
        my $token = (undef, '0', '1', '18446744073709551615', 1 + int rand 1e15)[ int rand 5 ];
        push @fields, [ token => "$token" ] if defined $token;
        push @fields, [ prev => 'crashed' ] if rand() < 0.3;
        # A semaphore's slot=K slots=N (SPEC 3b), K < N.
        my ($slot, $count);
        if (rand() < 0.3) {
            $count = (1, 2, 3, 1024, 1 + int rand 4294967295)[ int rand 5 ];
            $slot  = int rand $count;
            push @fields, [ slot => $slot ], [ slots => $count ];
        }
        for my $key (grep { rand() < 0.3 } qw(since host pid note)) {
            push @fields, [ $key => ('', '2025-01-01T00:00:00Z', '3', 'a=b', 'x?y', '%20', ':')[ int rand 7 ] ];
        }
        my $sep  = sub { (' ', ' ', ' ', '  ', "\t", " \t")[ int rand 6 ] };
        my $line = 'OK' . $sep->() . $profile;
        $line .= $sep->() . "$_->[0]=$_->[1]" for @fields;
        $line .= ('', '', ' ', "\r", " \r")[ int rand 5 ];
        my $ok = eval { NetLock::_parse_line($line) };
        my $why =
            !$ok                                      ? "died: $@"
          : $ok->{type} ne 'OK'                       ? "type $ok->{type}"
          : $ok->{raw} ne $line                       ? 'raw differs'
          : $ok->{profile} ne $profile                ? "profile $ok->{profile}"
          : $flat->($ok->{fields}) ne $flat->(\@fields) ? 'fields differ'
          : ($ok->{token} // '') ne ($token // '')    ? 'token ' . ($ok->{token} // 'undef')
          : ($ok->{slot} // '') ne ($slot // '')      ? 'slot ' . ($ok->{slot} // 'undef')
          : ($ok->{slot_count} // '') ne ($count // '') ? 'slot_count ' . ($ok->{slot_count} // 'undef')
          :                                             undef;
        push @failed, "case $i: $line: $why" if defined $why;
    }
    is(scalar @failed, 0, "$cases random OK lines (seed $seed) round-trip")
      or diag(join "\n", grep { defined } @failed[ 0 .. 4 ]);
};

subtest 'OK lines for several locks' => sub {
    # SPEC 3b: values comma-separated in the order named, an empty token place for a lock
    # without one, locks=N.
    my $ok = NetLock::_parse_line(
        'OK a backend=mkdir,flock,etcd mode=exclusive,shared,exclusive token=4,9, prev=crashed locks=3');
    is($ok->{profile}, 'a');
    is_deeply($ok->{locks}, [
        { backend => 'mkdir', shared => 0, token => 4,     slot => undef, slots => undef },
        { backend => 'flock', shared => 1, token => 9,     slot => undef, slots => undef },
        { backend => 'etcd',  shared => 0, token => undef, slot => undef, slots => undef },
    ], 'each lock in the order named');
    ok(!defined $ok->{token}, 'one token cannot stand for a set');
    $ok = NetLock::_parse_line('OK /tmp/x backend=flock,flock locks=2');
    is_deeply([ map { [ $_->{shared}, $_->{token} ] } @{ $ok->{locks} } ], [ [ 0, undef ], [ 0, undef ] ]);
    $ok = NetLock::_parse_line('OK a backend=mkdir mode=exclusive token=4');
    is_deeply([ scalar @{ $ok->{locks} }, $ok->{token} ], [ 1, 4 ], 'a single lock\'s line unchanged');
    for my $line (
        'OK a backend=mkdir,flock mode=exclusive,exclusive token=1,2',
        'OK a backend=mkdir token=4,9',
        'OK a backend=mkdir token=',
        'OK a backend=mkdir,flock token=1,2,3 locks=2',
        'OK a backend=mkdir,flock mode=exclusive locks=2',
        'OK a backend=mkdir, locks=2',
        'OK a backend=mkdir,flock mode=exclusive,sideways locks=2',
        'OK a backend=mkdir,flock token=1,x locks=2',
        'OK a backend=mkdir,flock locks=0',
        'OK a backend=mkdir,flock locks=two',
        'OK a backend=mkdir,flock locks=',
      )
    {
        dies_with(sub { NetLock::_parse_line($line) }, 'NetLock::Error::Protocol', $line);
    }
    # Randomized round trip, as the helper writes them.
    srand($ENV{NETLOCK_TEST_SEED} // 25);
    my @failed;
    for my $i (1 .. ($ENV{NETLOCK_TEST_CASES} // 3000) / 3) {
        my $profile = random_address();
        my @locks   = map {
            {
                backend => (qw(flock mkdir postgres etcd))[ int rand 4 ],
                shared  => rand() < 0.3 ? 1 : 0,
                token   => (undef, '0', '1', '18446744073709551615', 1 + int rand 1e15)[ int rand 5 ],
                @{ ([ slot => undef, slots => undef ], [ slot => undef, slots => undef ],
                    [ slot => 0, slots => 2 ], [ slot => 1, slots => 2 ], [ slot => 1023, slots => 1024 ])
                    [ int rand 5 ] },
            }
        } 1 .. 2 + int rand 4;
        my $line = "OK $profile backend=" . join(',', map { $_->{backend} } @locks) . ' mode='
          . join(',', map { $_->{shared} ? 'shared' : 'exclusive' } @locks);
        $line .= ' token=' . join(',', map { $_->{token} // '' } @locks)
          if grep { defined $_->{token} } @locks;
        if (grep { defined $_->{slot} } @locks) {
            $line .= ' slot=' . join(',', map { $_->{slot} // '' } @locks);
            $line .= ' slots=' . join(',', map { $_->{slots} // '' } @locks);
        }
        $line .= ' locks=' . @locks;
        my $ok   = eval { NetLock::_parse_line($line) };
        my $flat = sub {
            join ';', map { join ',', map { $_ // 'undef' } @{$_}{qw(backend shared token slot slots)} } @{ $_[0] };
        };
        push @failed, "case $i: $line: " . ($ok ? $flat->($ok->{locks}) : "died: $@")
          unless $ok
          && $flat->($ok->{locks}) eq $flat->(\@locks)
          && !defined $ok->{token}
          && !defined $ok->{slot};
    }
    is(scalar @failed, 0, 'random OK lines for several locks round-trip')
      or diag(join "\n", grep { defined } @failed[ 0 .. 4 ]);
};

subtest 'ERROR and LOST lines' => sub {
    for my $kind (qw(busy config unavailable denied lost usage io)) {
        my $e = NetLock::_parse_line("ERROR $kind: it went: wrong ");
        is($e->{class},   'NetLock::Error::' . ucfirst $kind, $kind);
        is($e->{message}, 'it went: wrong');
    }
    ok(!defined NetLock::_parse_line('ERROR spawn: x')->{class}, 'spawn is the client\'s word');
    for my $bad ('ERROR no colon', 'ERROR : empty kind', 'hello', '') {
        dies_with(sub { NetLock::_parse_line($bad) }, 'NetLock::Error::Protocol', "'$bad'");
    }
    is(NetLock::_parse_line('LOST server went away')->{reason}, 'server went away');
    is(NetLock::_parse_line('LOST')->{reason},                  '');
};

subtest 'errors' => sub {
    my $e = NetLock::Error::Busy->new(message => 'held by host=a pid=1', exit_code => 75);
    is("$e", "locksmith: busy: held by host=a pid=1\n", 'stringifies as locksmith: KIND: MESSAGE');
    is($e->kind,      'busy');
    is($e->exit_code, 75);
    isa_ok($e, 'NetLock::Error');
    is(NetLock::Error::class_for_code(74), 'NetLock::Error::Lost');
    is(NetLock::Error::class_for_code(78), 'NetLock::Error::Config');
    ok(!defined NetLock::Error::class_for_code(1), 'no class for 1');
};

subtest 'wait and tag arguments' => sub {
    my %cases = (
        0 => '0', '0.0' => '0', 0.3 => '300ms', 1e-9 => '1ms', 0.0025 => '3ms', 10 => '10000ms',
        '1.5' => '1500ms', forever => 'forever', '1m30s' => '1m30s', ' 2s ' => '2s',
        9**9**9 => 'forever',
    );
    for my $in (sort keys %cases) {
        is(NetLock::_wait_arg($in), $cases{$in}, "wait => '$in'");
    }
    ok(!defined NetLock::_wait_arg(undef), 'undef: the profile decides');
    for my $bad (-1, '', ' ', '-5s', '1 m', [1], 'nan') {
        dies_with(sub { NetLock::_wait_arg($bad) }, 'NetLock::Error::Usage', "wait => '$bad'");
    }
    is_deeply([ NetLock::_helper_args('demo', {}, undef) ], [qw(--watch-stdin hold demo)]);
    is_deeply(
        [ NetLock::_helper_args('demo', { profiles => '/etc/p.toml', shared => 1 }, '1500ms') ],
        [qw(--watch-stdin --profiles /etc/p.toml --wait 1500ms --shared hold demo)]
    );
    is(NetLock::_slots_arg($_), $_, "slots => $_") for 1, 2, 1024;
    ok(!defined NetLock::_slots_arg(undef), 'slots => undef: the profile decides');
    for my $bad (0, 1025, -1, 'x', '', ' 2', '1.5', [2], '99999999999') {
        my $e = dies_with(sub { NetLock::_slots_arg($bad) }, 'NetLock::Error::Usage', "slots => '$bad'");
        like($e->message, qr/1 to 1024/) if $e;
    }
    is_deeply(
        [ NetLock::_helper_args([ 'a', 'b' ], { shared => 1 }, '0', 3) ],
        [qw(--watch-stdin --wait 0 --shared --slots 3 hold a b)]
    );
    is(NetLock::_fair_arg($_), 1, "fair => '$_'") for 1, '1';
    is(NetLock::_fair_arg($_), 0, 'fair => ' . ($_ // 'undef') . ': the profile decides')
      for 0, '0', '', undef;
    for my $bad ('maybe', 'yes', 'true', 2, -1, '01', ' 1', "1\n", [1], {}) {
        my $e = dies_with(sub { NetLock::_fair_arg($bad) }, 'NetLock::Error::Usage', "fair => '$bad'");
        like($e->message, qr/expected 1 or 0/) if $e;
    }
    is_deeply(
        [ NetLock::_helper_args([ 'a', 'b' ], {}, '0', 3, 1) ],
        [qw(--watch-stdin --wait 0 --slots 3 --fair hold a b)]
    );
    for my $good ('demo', 'phone.stuff_1-2', '/var/lock/x.lock') {
        is(NetLock::_check_tag($good), $good, "tag $good");
    }
    for my $bad (undef, '', '-v', '--help', "a\nb", "a\0") {
        dies_with(sub { NetLock::_check_tag($bad) }, 'NetLock::Error::Usage', 'bad tag');
    }
    dies_with(sub { NetLock->new('x', nope => 1) }, 'NetLock::Error::Usage', 'unknown option');
    dies_with(sub { NetLock->new('x', 'odd') },     'NetLock::Error::Usage', 'odd option list');
};

subtest 'the test suites find the helper in cargo\'s target directory' => sub {
    # Issue 25 finding 6: wherever CARGO_TARGET_DIR puts it; LOCKSMITH_BIN wins; a missing
    # helper is reported (setup_helper skips on it, and dies under CI=true).
    my $target = File::Temp::tempdir('netlock-pl-target-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    local $ENV{CARGO_TARGET_DIR} = $target;
    local $ENV{LOCKSMITH_BIN};
    delete $ENV{LOCKSMITH_BIN};
    is(cargo_target_dir(), $target, 'cargo metadata names $CARGO_TARGET_DIR');
    my ($bin, $why) = find_helper();
    is($bin, "$target/debug/locksmith", 'looked for in the target directory');
    like($why, qr/^no locksmith helper at \Q$target\E/, 'missing: said so');
    mkdir "$target/debug" or die $!;
    write_file("$target/debug/locksmith", "#!/bin/sh\n");
    chmod 0755, "$target/debug/locksmith" or die $!;
    is_deeply([ find_helper() ], [ "$target/debug/locksmith", undef ], 'found there');
    write_file("$target/other", "#!/bin/sh\n");
    chmod 0755, "$target/other" or die $!;
    local $ENV{LOCKSMITH_BIN} = "$target/other";
    is_deeply([ find_helper() ], [ "$target/other", undef ], 'LOCKSMITH_BIN wins');

    # setup_helper in a child: skips without CI, dies under CI=true.
    $ENV{LOCKSMITH_BIN} = "$target/missing";
    my $run = sub {
        local $ENV{CI} = $_[0];
        my $out = `$^X -I$FindBin::Bin/lib -MNetLockTest=setup_helper -e setup_helper 2>&1`;
        return ($? >> 8, $out);
    };
    my ($code, $out) = $run->('');
    is($code, 0, 'without CI: a skip') or diag($out);
    like($out, qr/^1\.\.0 # SKIP no locksmith helper at \Q$target\E\/missing/, 'skip_all');
    ($code, $out) = $run->('true');
    isnt($code, 0, 'CI=true: a failure');
    like($out, qr/no locksmith helper at \Q$target\E\/missing/, 'saying why');
};

subtest 'helper lookup' => sub {
    my $dir = File::Temp::tempdir('netlock-lookup-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;
    mkdir "$dir/bin", 0755 or die $!;
    my $exe = "$dir/bin/locksmith";
    write_file($exe, "#!/bin/sh\nexit 0\n");
    chmod 0755, $exe;
    {
        local $ENV{LOCKSMITH_BIN} = '/env/ls';
        local $ENV{PATH}          = "$dir/bin";
        is_deeply([ NetLock::_find_helper('/x/ls') ], [ '/x/ls', 'given as helper =>' ]);
        is_deeply([ NetLock::_find_helper() ], [ '/env/ls', 'from $LOCKSMITH_BIN' ]);
        local $ENV{LOCKSMITH_BIN} = '';
        is_deeply([ NetLock::_find_helper() ], [ $exe, 'looked up on $PATH' ], 'empty env: PATH');
        local $ENV{PATH} = 'relative:.:';
        dies_with(sub { NetLock::_find_helper() }, 'NetLock::Error::Spawn', 'relative PATH entries');
    }
    delete local $ENV{LOCKSMITH_BIN};
    local $ENV{PATH} = "$dir/bin";
    chmod 0777, "$dir/bin";
    my $e = dies_with(sub { NetLock::_find_helper() }, 'NetLock::Error::Spawn', 'world-writable dir');
    like($e->message, qr/writable by group or others/, 'says why it was skipped') if $e;
    chmod 0775, "$dir/bin";
    like(NetLock::_untrusted($exe) // '', qr/writable/, 'group-writable dir');
    chmod 0755, "$dir/bin";
    chmod 0777, $exe;
    like(NetLock::_untrusted($exe) // '', qr/writable/, 'writable file');
    chmod 0755, $exe;
    ok(!defined NetLock::_untrusted($exe), 'trusted');
    chmod 0777, $dir;
    like(NetLock::_untrusted($exe) // '', qr/writable/, 'an ancestor writable without sticky bit');
    chmod 01777, $dir;
    ok(!defined NetLock::_untrusted($exe), 'a sticky ancestor, as /tmp, is fine');
    chmod 0755, $dir;
    mkdir "$dir/other", 0777 or die $!;
    chmod 0777, "$dir/other";
    write_file("$dir/other/real", "#!/bin/sh\n");
    chmod 0755, "$dir/other/real";
    symlink "$dir/other/real", "$dir/bin/link" or die $!;
    like(NetLock::_untrusted("$dir/bin/link") // '', qr/writable/, 'a symlink\'s target dir is checked');
};

subtest 'the guard against a fake helper' => sub {
    my $dir  = File::Temp::tempdir('netlock-fake-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $fake = fake_helper($dir);
    my %h    = (helper => $fake);

    my $lock = NetLock->new('plain1', %h, profiles => '/p.toml', wait => 1.5, shared => 1);
    is(read_file("$dir/plain1.args"),
        join('', map {"$_\n"} qw(--watch-stdin --profiles /p.toml --wait 1500ms --shared hold plain1)),
        'the helper\'s command line');
    is($lock->token,          42);
    is($lock->prev_crashed,   1);
    is($lock->backend,        'fake');
    is($lock->profile,        'plain1');
    is($lock->field('since'), '2025-01-01T00:00:00Z');
    ok($lock->is_held, 'held');
    is($lock->unlock, 1, 'unlock says it released');
    ok(-e "$dir/plain1.released", 'unlock returned after the helper finished');
    is($lock->unlock, 0, 'a second unlock returns 0, as in the seed');
    ok(!$lock->is_held, 'not held after unlock');

    my $e = dies_with(sub { NetLock->new('busy1', %h) }, 'NetLock::Error::Busy', 'busy');
    is($e->exit_code, 75) if $e;
    ok(!defined NetLock->try_new('busy2', %h), 'try_new: undef when busy');
    $e = dies_with(sub { NetLock->new('odd1', %h) }, 'NetLock::Error::Config', 'unknown word: exit code');
    is($e->message, 'strange: what', 'the word is kept') if $e;
    $e = dies_with(sub { NetLock->new('quiet1', %h) }, 'NetLock::Error::Unavailable', 'no line, 69');
    like($e->message, qr/without writing a status line/) if $e;
    dies_with(sub { NetLock->new('zero1', %h) },    'NetLock::Error::Protocol', 'no line, 0');
    dies_with(sub { NetLock->new('garbage1', %h) }, 'NetLock::Error::Protocol', 'garbage');
    $e = dies_with(sub { NetLock->new('other1', %h) }, 'NetLock::Error::Protocol', 'other profile');
    like($e->message, qr/instead of/) if $e;
    dies_with(sub { NetLock->new('x', helper => "$dir/missing") }, 'NetLock::Error::Spawn', 'missing');

    $lock = NetLock->new('lost1', %h);
    is($lock->token, 9);
    ok($lock->wait_lost(10), 'wait_lost sees LOST');
    ok(!$lock->is_held, 'not held after LOST');
    $e = dies_with(sub { $lock->check }, 'NetLock::Error::Lost', 'check');
    is($e->message, 'server went away') if $e;
    $e = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'unlock after LOST');
    is_deeply([ $e->message, $e->exit_code ], [ 'server went away', 74 ]) if $e;
    ok($lock->lost, 'lost stays true after unlocking a lost lock');

    $lock = NetLock->new('early1', %h);
    ok($lock->wait_lost(10), 'an exiting helper is a lost lock');
    $e = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'exit 0 before unlock');
    like($e->message, qr/before unlock was asked for/) if $e;

    $lock = NetLock->new('relfail1', %h);
    ok(!$lock->lost, 'held: not lost');
    $e = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'exit 74 on release');
    is($e->exit_code, 74) if $e;
    like($e->message, qr/while releasing/) if $e;
    ok($lock->lost, 'a failed release is a loss');

    # Several locks: one helper, every name on its command line (each once).
    $lock = NetLock->new([ 'set1', 'pair1' ], %h);
    is(read_file("$dir/pair1.args"), join('', map {"$_\n"} qw(--watch-stdin hold set1 pair1)),
        'a set on one command line');
    is_deeply([ $lock->tags ],     [ 'set1', 'pair1' ]);
    is_deeply([ $lock->tokens ],   [ 5, undef ], 'tokens in the order named');
    is_deeply([ $lock->backends ], [ 'fake', 'other' ]);
    is($lock->backend, 'fake,other');
    is($lock->profile, 'set1');
    ok(!defined $lock->token, 'one token cannot stand for a set');
    is($lock->is_shared, 0, 'one of the two is exclusive');
    is($lock->unlock, 1);
    ok(-e "$dir/pair1.released", 'released');
    $lock = NetLock->try_new([ 'set2', 'pair2', 'set2' ], %h);
    is(read_file("$dir/pair2.args"), join('', map {"$_\n"} qw(--watch-stdin --wait 0 hold set2 pair2)),
        'the same name twice is sent once');
    is_deeply([ $lock->tokens ],   [ 5, undef, 5 ], 'and reported in each place it was given');
    is_deeply([ $lock->backends ], [ 'fake', 'other', 'fake' ]);
    $lock->unlock;
    $lock = NetLock->new([ 'okay6', 'okay6' ], %h);
    is(read_file("$dir/okay6.args"), join('', map {"$_\n"} qw(--watch-stdin hold okay6)));
    is_deeply([ $lock->token, $lock->tokens ], [ 42, 42, 42 ], 'one name twice: a single lock');
    $lock->unlock;
    $e = dies_with(sub { NetLock->new([ 'set3', 'merged1' ], %h) }, 'NetLock::Error::Usage',
        'two names for one lock');
    like($e->message, qr/name each lock once; released$/) if $e;
    ok(-e "$dir/merged1.released", 'released before dying');
    dies_with(sub { NetLock->new([ 'okay7', '-v' ], %h) }, 'NetLock::Error::Usage', 'a bad name in a set');
    ok(!-e "$dir/-v.args", 'refused before spawning');
    dies_with(sub { NetLock->new([], %h) }, 'NetLock::Error::Usage', 'an empty set');

    # Semaphores: --slots N, the slot reported; per name for a set.
    $lock = NetLock->new('sem1', %h, slots => 3);
    is(read_file("$dir/sem1.args"), join('', map {"$_\n"} qw(--watch-stdin --slots 3 hold sem1)),
        'slots => 3 is --slots 3');
    is_deeply([ $lock->slot, $lock->slot_count, [ $lock->slots ], [ $lock->slot_counts ] ],
        [ 1, 3, [1], [3] ], 'slot and slot_count');
    $lock->unlock;
    $lock = NetLock->new('plain2', %h);
    ok(!defined $lock->slot && !defined $lock->slot_count, 'no slot without slots');
    $lock->unlock;
    $lock = NetLock->try_new([ 'set4', 'semset1', 'set4' ], %h, slots => 1);
    is(read_file("$dir/semset1.args"),
        join('', map {"$_\n"} qw(--watch-stdin --wait 0 --slots 1 hold set4 semset1)));
    is_deeply([ $lock->slots ],       [ undef, 2, undef ], 'slots in the order named');
    is_deeply([ $lock->slot_counts ], [ undef, 3, undef ]);
    ok(!defined $lock->slot, 'one slot cannot stand for a set');
    $lock->unlock;
    for my $case ([ 0, 'sem2' ], [ 1025, 'sem3' ], [ 'x', 'sem4' ]) {
        my ($n, $tag) = @$case;
        dies_with(sub { NetLock->new($tag, %h, slots => $n) }, 'NetLock::Error::Usage', "slots => $n");
        dies_with(sub { NetLock->try_new($tag, %h, slots => $n) }, 'NetLock::Error::Usage', "try_new slots => $n");
        ok(!-e "$dir/$tag.args", "slots => $n: refused before spawning");
    }

    # Fair queues: --fair after --slots; 0 passes nothing; not a boolean: refused.
    $lock = NetLock->new('plain3', %h, fair => 1);
    is(read_file("$dir/plain3.args"), join('', map {"$_\n"} qw(--watch-stdin --fair hold plain3)),
        'fair => 1 is --fair');
    $lock->unlock;
    $lock = NetLock->try_new('sem6', %h, slots => 2, fair => 1);
    is(read_file("$dir/sem6.args"),
        join('', map {"$_\n"} qw(--watch-stdin --wait 0 --slots 2 --fair hold sem6)));
    $lock->unlock;
    $lock = NetLock->new('plain4', { %h, fair => 0 });
    is(read_file("$dir/plain4.args"), join('', map {"$_\n"} qw(--watch-stdin hold plain4)),
        'fair => 0 passes nothing');
    $lock->unlock;
    for my $case ([ 'maybe', 'plain5' ], [ 2, 'plain6' ], [ 'yes', 'plain7' ]) {
        my ($v, $tag) = @$case;
        dies_with(sub { NetLock->new($tag, %h, fair => $v) }, 'NetLock::Error::Usage', "fair => $v");
        dies_with(sub { NetLock->try_new($tag, %h, fair => $v) }, 'NetLock::Error::Usage', "try_new fair => $v");
        ok(!-e "$dir/$tag.args", "fair => $v: refused before spawning");
    }

    my @warnings;
    {
        local $SIG{__WARN__} = sub { push @warnings, @_ };
        {
            my $l = NetLock->new('relfail2', %h);
            ok($l->is_held, 'held until the end of its scope');
        }
    }
    like(join('', @warnings), qr/^netlock: releasing "relfail2": locksmith: lost:/,
        'DESTROY reports a failed release with warn, never dies');
    no_children();
};

done_testing;

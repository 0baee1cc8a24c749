package containerd

// RuncVersion and RuncTooOld let the external tests compare Runtime.Warnings with the version check itself.
var (
	RuncVersion = runcVersion
	RuncTooOld  = runcTooOld
	CrunVersion = crunVersion
)

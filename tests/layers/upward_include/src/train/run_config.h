// The train header the dist header above must not see.
#pragma once
